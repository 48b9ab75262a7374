"""Parse YAML while remembering where every value came from (line and column).

PyYAML's ``safe_load`` drops source positions and silently keeps the last of two duplicate keys;
both matter when telling a user which line of their matrix is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from buildkit.errors import Finding, Location
from buildkit.violation import PathKey


@dataclass
class SourceMap:
    """Positions of the keys and values of one parsed YAML document."""

    path: Path
    keys: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    values: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    raw: dict[PathKey, str] = field(default_factory=dict)  # scalar text as written

    def locate(self, loc: PathKey, *, prefer_key: bool = False) -> Location:
        """The position of ``loc``, or of its nearest ancestor that was in the file."""
        for end in range(len(loc), -1, -1):
            prefix = loc[:end]
            first, second = (self.keys, self.values) if prefer_key else (self.values, self.keys)
            pos = first.get(prefix) or second.get(prefix)
            if pos is not None:
                return Location(self.path, pos[0], pos[1])
        return Location(self.path)


class YamlSourceError(Exception):
    """The text is not well-formed YAML (or not a mapping at the top level)."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__("; ".join(f.message for f in findings))
        self.findings = findings


def _mark(node: Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _field_name(path: PathKey) -> str:
    return format_path(path) or "<document>"


def format_path(path: PathKey) -> str:
    """``('stacks', 'cann8.3', 'os', 0)`` -> ``stacks.cann8.3.os[0]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class _Builder:
    def __init__(self, source: Path) -> None:
        self.map = SourceMap(source)
        self.constructor = SafeConstructor()
        self.findings: list[Finding] = []

    def build(self, node: Node, path: PathKey) -> Any:
        self.map.values.setdefault(path, _mark(node))
        if isinstance(node, MappingNode):
            return self._mapping(node, path)
        if isinstance(node, SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        assert isinstance(node, ScalarNode)
        self.map.raw[path] = node.value
        return self.constructor.construct_object(node, deep=True)

    def _mapping(self, node: MappingNode, path: PathKey) -> dict[Any, Any]:
        self.constructor.flatten_mapping(node)  # resolve `<<: *anchor` merge keys
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                line, col = _mark(key_node)
                self.findings.append(
                    Finding(
                        Location(self.map.path, line, col),
                        _field_name(path),
                        "a mapping key must be a plain scalar",
                    )
                )
                continue
            key = self.constructor.construct_object(key_node, deep=True)
            line, col = _mark(key_node)
            if key in result:
                first = self.map.keys.get((*path, key), (0, 0))
                self.findings.append(
                    Finding(
                        Location(self.map.path, line, col),
                        _field_name((*path, key)),
                        f"duplicate key {key!r} (first defined on line {first[0]})",
                        hint="each key once per mapping",
                    )
                )
                continue
            child = (*path, key)
            self.map.keys[child] = (line, col)
            result[key] = self.build(value_node, child)
        return result


# libyaml's parser when PyYAML has it (several times faster); the pure-Python one otherwise.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_DEPTH = 64  # the matrix nests about 6 deep; anything past this is not a configuration
MAX_NODES = 200_000  # after aliases are expanded; the shipped matrix has a few thousand


class YamlTooLarge(ValueError):
    """The document nests too deeply or expands (through aliases) past the limits."""

    def __init__(self, message: str, line: int = 0, column: int = 0) -> None:
        super().__init__(message)
        self.line, self.column = line, column


def _event_mark(event: yaml.Event) -> tuple[int, int]:
    mark = event.start_mark
    return (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)


def check_yaml_size(text: str) -> None:
    """Refuse alias bombs and absurd nesting before anything is built, in time linear in the text.

    Walks PyYAML's event stream (which neither recurses nor expands aliases), counting each
    collection's nodes with its aliases expanded; raises :class:`YamlTooLarge` at the first
    collection past ``MAX_DEPTH`` or once the expanded total passes ``MAX_NODES``. Malformed YAML
    is left for the loader to report with its own message."""
    sizes: dict[str, int] = {}
    stack: list[tuple[str | None, int]] = []  # (anchor, nodes so far) per open collection
    total = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) >= MAX_DEPTH:
                    raise YamlTooLarge(f"nested more than {MAX_DEPTH} levels deep", *_event_mark(event))
                stack.append((event.anchor, 1))
                continue
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, count = stack.pop()
            elif isinstance(event, yaml.AliasEvent):
                anchor, count = None, sizes.get(event.anchor or "", 1)
            elif isinstance(event, yaml.ScalarEvent):
                anchor, count = event.anchor, 1
            else:
                continue
            if anchor:
                sizes[anchor] = count
            if stack:
                stack[-1] = (stack[-1][0], stack[-1][1] + count)
            else:
                total += count
            if total + sum(c for _, c in stack) > MAX_NODES:
                raise YamlTooLarge(f"expands to more than {MAX_NODES} values through its aliases (an alias bomb?)", *_event_mark(event))
    except yaml.MarkedYAMLError as exc:
        # libyaml (bundled with PyYAML 6.0.4 on) refuses flow nesting past 1000 itself, while its
        # scanner looks ahead, before the events above reach MAX_DEPTH: the same verdict, said ours
        if "nesting depth" in (exc.problem or ""):
            mark = exc.problem_mark
            where = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
            raise YamlTooLarge(f"nested more than {MAX_DEPTH} levels deep (the YAML parser: {exc.problem})", *where) from None
        return  # malformed: the loader reports it with its own message
    except yaml.YAMLError:
        return


def load_documents(text: str, source: str) -> list[Any]:
    """Every document of a YAML stream (manifests, printed configs), with the same size limits."""
    try:
        check_yaml_size(text)
        return list(yaml.load_all(text, Loader=_LOADER))  # safe: _LOADER is a SafeLoader (libyaml's where PyYAML has it)
    except YamlTooLarge as exc:
        raise YamlSourceError([Finding(Location(Path(source), exc.line, exc.column), "<document>", f"refused: {exc}")]) from None


def load_yaml(text: str, source: Path) -> tuple[dict[str, Any], SourceMap, list[Finding]]:
    """Parse ``text`` into plain data, its :class:`SourceMap` and non-fatal findings.

    Duplicate keys are findings (the first value is kept, so validation can go on and report
    everything else too). Raises :class:`YamlSourceError` when nothing sensible can be built:
    malformed YAML, an empty document, or one that is not a mapping.
    """
    try:
        check_yaml_size(text)
    except YamlTooLarge as exc:
        raise YamlSourceError([Finding(Location(source, exc.line, exc.column), "<document>", f"refused: {exc}")]) from None
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = Location(source, mark.line + 1, mark.column + 1) if mark else Location(source)
        problem = exc.problem or exc.context or "malformed YAML"
        raise YamlSourceError([Finding(loc, "<document>", f"malformed YAML: {problem}")]) from None
    except yaml.YAMLError as exc:
        raise YamlSourceError([Finding(Location(source), "<document>", f"malformed YAML: {exc}")]) from None
    if node is None:
        raise YamlSourceError(
            [Finding(Location(source), "<document>", "the file is empty", hint="a mapping with schema_version, stacks, skus, ...")]
        )
    if not isinstance(node, MappingNode):
        line, col = _mark(node)
        raise YamlSourceError(
            [
                Finding(
                    Location(source, line, col),
                    "<document>",
                    "the top level must be a mapping",
                    hint="schema_version: 1, stacks: {...}, ...",
                )
            ]
        )
    builder = _Builder(source)
    try:
        data = builder.build(node, ())
    except ConstructorError as exc:
        mark = exc.problem_mark
        loc = Location(source, mark.line + 1, mark.column + 1) if mark else Location(source)
        raise YamlSourceError([Finding(loc, "<document>", f"malformed YAML: {exc.problem}")]) from None
    return data, builder.map, builder.findings
