"""Load ``compat_matrix.yaml``: parse, check the structure, then the compatibility rules.

All problems are collected and reported together, each with file, line, column and field path.
"""

from __future__ import annotations

import difflib
import threading
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from buildkit.errors import Finding, InputError, MatrixError
from buildkit.framework import frameworks
from buildkit.fsio import read_input_text
from buildkit.matrix import ruleset
from buildkit.matrix.model import STANZA_TAGS, FrameworkSource, Matrix, PypiPin, Sku, Stack
from buildkit.matrix.yamlsource import SourceMap, YamlSourceError, format_path, load_yaml
from buildkit.resources import DEFAULT_MATRIX
from buildkit.violation import PathKey


@dataclass(frozen=True)
class LoadedMatrix:
    """A validated matrix plus where it came from (for locating later findings)."""

    matrix: Matrix
    path: Path
    source: SourceMap
    warnings: tuple[Finding, ...] = ()

    @property
    def root(self) -> Path:
        """The directory the matrix lives in: generated files are written relative to it."""
        return self.path.resolve().parent

    def default_stack(self) -> str:
        return next(name for name, stack in self.matrix.stacks.items() if stack.default)


def read_matrix_text(path: Path) -> str:
    try:
        missing = not path.exists() and not path.is_symlink()
    except OSError:  # a name too long, a folder without permission: read_input_text names it
        missing = False
    if missing:
        raise InputError(f"{path}: matrix file not found (pass --matrix PATH, default ./{DEFAULT_MATRIX})")
    return read_input_text(path, "matrix file")


def load_matrix(path: Path = DEFAULT_MATRIX) -> LoadedMatrix:
    """Parse and validate the matrix at ``path``.

    Raises :class:`MatrixError` carrying every finding when the matrix is malformed, structurally
    invalid or breaks a compatibility rule; rule warnings are returned on the result.
    """
    return parse_matrix(read_matrix_text(path), path)


# What this process parsed before, by what the result depends on: the text, the path findings name and the
# plug-ins whose stanzas and rules judged it. Parsing (YAML with every node's position, the models, the
# rules) is most of what a small command costs, and a process that reads the same matrix again (a
# long-lived caller of the API, `render --all`'s files, the test suite's in-process commands) need not pay
# it again: the result is frozen models and a source map nothing writes to. A refused matrix is not kept.
_PARSED: dict[tuple[str, str, tuple[tuple[str, int], ...]], LoadedMatrix] = {}
_PARSED_KEPT = 8  # the least recently used goes first
_PARSED_LOCK = threading.Lock()  # the API's callers may parse from several threads


def parse_matrix(text: str, path: Path) -> LoadedMatrix:
    key = (text, str(path), tuple((name, id(plugin)) for name, plugin in frameworks().items()))
    with _PARSED_LOCK:
        kept = _PARSED.pop(key, None)
        if kept is not None:
            _PARSED[key] = kept  # the most recently used is the last to go
    if kept is not None:
        return kept
    loaded = _parse_matrix(text, path)
    with _PARSED_LOCK:
        while len(_PARSED) >= _PARSED_KEPT:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[key] = loaded
    return loaded


def _parse_matrix(text: str, path: Path) -> LoadedMatrix:
    try:
        data, source, syntax = load_yaml(text, path)
    except YamlSourceError as exc:
        raise MatrixError(exc.findings) from None
    try:
        matrix = Matrix.model_validate(data)
    except ValidationError as exc:
        raise MatrixError(syntax + [_structure_finding(err, source) for err in _stanza_errors(exc.errors())]) from None
    # a key no plug-in owns whose value happens to read as a stanza: as unknown as any other
    unknown = [
        _unknown_key(("stacks", sid, key)) for sid, stack in matrix.stacks.items() for key in stack.frameworks if key not in frameworks()
    ]
    if syntax or unknown:
        raise MatrixError(syntax + [_structure_finding(err, source) for err in unknown])
    findings = [
        Finding(
            source.locate(v.path),
            format_path(v.path),
            v.message,
            hint=v.hint,
            rule=rule_id,
            severity=v.severity,
        )
        for rule_id, v in ruleset.check(matrix)
    ]
    if any(f.severity == "error" for f in findings):
        raise MatrixError(findings)
    return LoadedMatrix(matrix, path, source, tuple(findings))


# Examples shown when a value does not match its pattern, keyed by field name.
_EXAMPLES = {
    "cann": "8.3.RC1, 8.5.0, 9.1.0",
    "python": '"3.11" (quoted: an unquoted 3.10 is the number 3.1)',
    "ref": "a tag, branch or commit, e.g. core_v0.12.1",
    "soc_version": "ascend910b1, ascend910_9391",
    "cann_chip": "910b, a3",
    "k8s_accelerator_type": "module-910b-16",
    "k8s_npu_resource": "huawei.com/Ascend910, huawei.com/ascend-1980",
    "k8s_ring_controller": "ascend-910b",
    "url": "https://...",
    "arg": "PIP_INDEX_URL (upper case)",
    "registry": "quay.io/ascend",
}


_TYPE_NAMES = {"string_type": "a string", "int_type": "an integer", "bool_type": "true or false"}


def _structure_finding(err: ErrorDetails, source: SourceMap) -> Finding:
    loc: PathKey = tuple(part for part in err["loc"] if part != "[key]")
    kind = err["type"]
    message = err["msg"].removeprefix("Value error, ")
    hint = ""
    field_name = str(loc[-1]) if loc else ""
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(field_name, allowed, n=1)
        message = f"unknown key {field_name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
        hint = ", ".join(allowed)
        return Finding(source.locate(loc, prefer_key=True), format_path(loc), message, hint=hint)
    if kind == "missing":
        message = "required field is missing"
        hint = f"add `{field_name}:`"
    elif kind in ("string_type", "int_type", "bool_type"):
        got = err.get("input")
        message = f"expected {_TYPE_NAMES[kind]}, got {type(got).__name__} {got!r}"
        if kind == "string_type" and isinstance(got, (int, float)):
            hint = f'quote the value as written: "{source.raw.get(loc, got)}"'
    elif kind == "string_pattern_mismatch":
        message = f"{err.get('input')!r} is not valid here"
        hint = _EXAMPLES.get(field_name, f"a value matching {err.get('ctx', {}).get('pattern')}")
    elif kind == "literal_error":
        message = f"{err.get('input')!r} is not allowed"
        hint = str(err.get("ctx", {}).get("expected", ""))
    if not hint:
        hint = _EXAMPLES.get(field_name, "")
    if err["loc"] and err["loc"][-1] == "[key]":
        return Finding(source.locate(loc, prefer_key=True), format_path(loc), f"invalid key: {message}", hint=hint)
    return Finding(source.locate(loc), format_path(loc), message, hint=hint)


def _stanza_errors(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """Errors under a stack's extra keys (its framework's stanza) read as if the key were a field:
    the form a stanza was checked as (``index``, ``checkout``) left out of the path, and a key no
    framework plug-in has reported once, as an unknown key."""
    out: list[ErrorDetails] = []
    unknown: set[tuple[str | int, ...]] = set()
    for err in errors:
        loc = err["loc"]
        if len(loc) < 3 or loc[0] != "stacks" or loc[2] in Stack.model_fields:
            out.append(err)
            continue
        key = loc[:3]
        if str(loc[2]) not in frameworks():
            if key not in unknown:
                unknown.add(key)
                out.append(_unknown_key(key))
            continue
        out.append({**err, "loc": (*key, *(p for p in loc[3:4] if p not in STANZA_TAGS), *loc[4:])})
    return out


def _unknown_key(loc: tuple[str | int, ...]) -> ErrorDetails:
    """An error as pydantic reports a key a model forbids: the one way an unknown key is said."""
    return {"type": "extra_forbidden", "loc": loc, "msg": "unknown key", "input": None}


def _allowed_keys(loc: PathKey) -> list[str]:
    """The field names of the model at ``loc`` (walking dicts, tuples and optionals)."""
    tp: Any = Matrix
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None and tp is Stack and str(part) in frameworks():  # a framework's stanza, in its plug-in's form
                tp = FrameworkSource if frameworks()[str(part)].install == "checkout" else PypiPin
                continue
            if field is None:
                return []
            tp = field.annotation
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) is tuple:
            tp = typing.get_args(tp)[0]
        else:
            return []
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [*tp.model_fields, *(frameworks() if tp is Stack else ())]
    return []


def _unwrap(tp: Any) -> Any:
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = args[0]
        else:
            return tp


# ---- lookups used by the CLI and the renderer -------------------------------------------------


def resolve_stack(loaded: LoadedMatrix, name: str | None) -> tuple[str, Stack]:
    matrix = loaded.matrix
    if name is None:
        name = loaded.default_stack()
    stack = matrix.stacks.get(name)
    if stack is None:
        close = difflib.get_close_matches(name, list(matrix.stacks), n=1)
        suggestion = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError(f"unknown stack {name!r}{suggestion}; stacks in {loaded.path}: {', '.join(matrix.stacks)}")
    return name, stack


def check_stack_sku(loaded: LoadedMatrix, stack_id: str, sku_id: str) -> None:
    """The stack must support the SKU; the refusal lists what it supports and which stacks do."""
    stacks = loaded.matrix.stacks
    if sku_id not in stacks[stack_id].skus:
        others = ", ".join(s for s, st in stacks.items() if sku_id in st.skus) or "none"
        raise InputError(
            f"stack {stack_id!r} does not support SKU {sku_id!r}; it supports: {', '.join(stacks[stack_id].skus)} "
            f"(stacks for {sku_id}: {others})"
        )


@dataclass(frozen=True)
class HardwareTarget:
    """What ``--hw`` named: a chip family (image target) and, when a SKU was named, the SKU."""

    name: str
    chip_id: str
    sku_id: str | None

    def skus(self, loaded: LoadedMatrix) -> dict[str, Sku]:
        if self.sku_id is not None:
            return {self.sku_id: loaded.matrix.skus[self.sku_id]}
        return {k: s for k, s in loaded.matrix.skus.items() if s.chip == self.chip_id}


def resolve_hw(loaded: LoadedMatrix, hw: str) -> HardwareTarget:
    matrix = loaded.matrix
    if hw in matrix.skus:
        return HardwareTarget(hw, matrix.skus[hw].chip, hw)
    if hw in matrix.chips:
        return HardwareTarget(hw, hw, None)
    names = sorted(set(matrix.skus) | set(matrix.chips))
    close = difflib.get_close_matches(hw, names, n=1)
    suggestion = f" (did you mean {close[0]!r}?)" if close else ""
    raise InputError(f"unknown --hw {hw!r}{suggestion}; SKUs: {', '.join(matrix.skus)}; chip families: {', '.join(matrix.chips)}")


def resolve_sku(loaded: LoadedMatrix, hw: str, why: str) -> tuple[str, Sku, str]:
    """``--hw`` for commands that need one SKU (its NPU count), not a chip family: (id, SKU, chip)."""
    target = resolve_hw(loaded, hw)
    if target.sku_id is None:
        skus = ", ".join(s for s, sku in loaded.matrix.skus.items() if sku.chip == target.chip_id)
        raise InputError(f"--hw {hw} names a chip family; {why}: one of {skus}")
    return target.sku_id, loaded.matrix.skus[target.sku_id], target.chip_id
