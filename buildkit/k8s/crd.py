"""Custom resources checked against their upstream CRDs the way an API server with strict field
validation (``kubectl apply --validate=strict``) checks them on create.

The CRDs are vendored verbatim in ``crds/`` (``SOURCES.json`` records repository, tag, commit and
sha256 of each). A CRD's ``openAPIV3Schema`` is a structural schema; what is honoured here:

- fields a schema does not declare are refused, unless it says ``x-kubernetes-preserve-unknown-fields``;
- ``type`` (``integer`` never accepts a boolean or a float; ``number`` accepts both numbers),
  ``format: int32/int64`` ranges, ``nullable`` (a null in a non-nullable field is pruned by the API
  server, as here), ``x-kubernetes-int-or-string``, ``x-kubernetes-embedded-resource``;
- ``enum``, ``pattern``, ``minLength``/``maxLength``, ``minimum``/``maximum``, ``minItems``/``maxItems``,
  ``minProperties``/``maxProperties``, ``required``, ``anyOf``/``allOf``/``oneOf``/``not``;
- ``x-kubernetes-list-type: set`` and ``map`` (duplicate items or keys refused).

Not evaluated: ``x-kubernetes-validations`` (CEL). The vendored CRDs carry five such rules, all on
fields ascendkit never writes (RayJob ``deletionStrategy``, ``managedBy``, GCS fault tolerance); each
is reported as unchecked by :func:`unchecked_rules` so a reader knows. The root ``metadata`` is an
ObjectMeta: the caller checks it with the Kubernetes schemas.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from buildkit import fsio

CRD_DIR = Path(__file__).resolve().parent / "crds"
SOURCES = CRD_DIR / "SOURCES.json"
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Crd:
    group: str
    kind: str
    versions: dict[str, dict[str, Any]]  # served version -> openAPIV3Schema
    source: dict[str, str]  # its SOURCES.json entry

    @property
    def label(self) -> str:
        return f"{self.source['repository'].rsplit('/', 1)[-1]} {self.source['tag']} {self.group} {self.kind} CRD"


def sources() -> list[dict[str, str]]:
    entries: list[dict[str, str]] = json.loads(SOURCES.read_text(encoding="utf-8"))["crds"]
    return entries


def sha256_of(name: str) -> str:
    return fsio.sha256_of(CRD_DIR / name)


@functools.cache
def crds() -> dict[tuple[str, str], Crd]:
    """(group, kind) -> the vendored CRD."""
    found = {}
    for entry in sources():
        doc = yaml.load((CRD_DIR / entry["file"]).read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        spec = doc["spec"]
        versions = {v["name"]: v["schema"]["openAPIV3Schema"] for v in spec["versions"] if v.get("served")}
        found[(spec["group"], spec["names"]["kind"])] = Crd(spec["group"], spec["names"]["kind"], versions, entry)
    return found


def crd_for(api_version: str, kind: str) -> tuple[Crd, dict[str, Any]] | tuple[None, None]:
    """The vendored CRD and version schema for a document's apiVersion and kind, if ascendkit has it."""
    group, _, version = api_version.rpartition("/")
    crd = crds().get((group, kind))
    if crd is None:
        return None, None
    schema = crd.versions.get(version)
    return (crd, schema) if schema is not None else (crd, {})


def unchecked_rules(schema: dict[str, Any], path: str = "") -> list[str]:
    """Where a schema has CEL rules this validator does not evaluate."""
    found = [path or "(top)"] if schema.get("x-kubernetes-validations") else []
    for name, sub in (schema.get("properties") or {}).items():
        found += unchecked_rules(sub, f"{path}.{name}".lstrip("."))
    for key in ("items", "additionalProperties"):
        sub = schema.get(key)
        if isinstance(sub, dict):
            found += unchecked_rules(sub, f"{path}[]" if key == "items" else f"{path}.*")
    return found


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TYPE_OK = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


class _Checker:
    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def add(self, path: list[str | int], message: str) -> None:
        self.problems.append((".".join(str(p) for p in path), message))

    def check(self, value: Any, schema: dict[str, Any], path: list[str | int], *, structural: bool = True) -> None:
        """``structural`` False inside anyOf/allOf/oneOf/not: those only add constraints, they declare no fields."""
        if value is None:
            if schema.get("nullable"):
                return
            return  # the API server prunes a null in a non-nullable field before validating
        if schema.get("x-kubernetes-int-or-string"):
            if not (isinstance(value, str) or _TYPE_OK["integer"](value)):
                self.add(path, f"{_short(value)} is neither an integer nor a string")
                return
        elif "type" in schema:
            kind = schema["type"]
            if not _TYPE_OK.get(kind, lambda v: True)(value):
                self.add(path, f"{_short(value)} is not of type {kind!r}")
                return
        self._constraints(value, schema, path)
        for key in ("allOf", "anyOf", "oneOf"):
            branches = schema.get(key)
            if branches:
                self._branches(key, branches, value, path)
        if isinstance(schema.get("not"), dict) and self._passes(value, schema["not"], path):
            self.add(path, "matches a schema it must not match")
        if isinstance(value, dict):
            self._object(value, schema, path, structural=structural)
        elif isinstance(value, list):
            self._array(value, schema, path, structural=structural)

    def _passes(self, value: Any, schema: dict[str, Any], path: list[str | int]) -> bool:
        sub = _Checker()
        sub.check(value, schema, path, structural=False)
        return not sub.problems

    def _branches(self, key: str, branches: list[dict[str, Any]], value: Any, path: list[str | int]) -> None:
        results = [_Checker() for _ in branches]
        for checker, branch in zip(results, branches, strict=True):
            checker.check(value, branch, path, structural=False)
        passed = sum(1 for c in results if not c.problems)
        if key == "allOf":
            for checker in results:
                self.problems += checker.problems
        elif key == "anyOf" and passed == 0:
            self.add(
                path, f"{_short(value)} matches none of the allowed forms ({'; '.join(m for c in results for _, m in c.problems[:1])})"
            )
        elif key == "oneOf" and passed != 1:
            self.add(path, f"{_short(value)} must match exactly one allowed form, matches {passed}")

    def _constraints(self, value: Any, schema: dict[str, Any], path: list[str | int]) -> None:
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(json.dumps(e) for e in schema["enum"])
            self.add(path, f"Unsupported value: {_short(value)}: supported values: {allowed}")
        if isinstance(value, str):
            if "pattern" in schema and not _regex(schema["pattern"]).search(value):
                self.add(path, f"{_short(value)} does not match {schema['pattern']!r}")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                self.add(path, f"may not be more than {schema['maxLength']} characters ({len(value)})")
            if "minLength" in schema and len(value) < schema["minLength"]:
                self.add(path, f"should be at least {schema['minLength']} characters ({len(value)})")
        if _TYPE_OK["number"](value):
            fmt = schema.get("format")
            low, high = INT32 if fmt == "int32" else INT64 if fmt == "int64" else (None, None)
            if low is not None and high is not None and not low <= value <= high:
                self.add(path, f"{value} is out of the {fmt} range")
            if "minimum" in schema and value < schema["minimum"]:
                self.add(path, f"should be greater than or equal to {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                self.add(path, f"should be less than or equal to {schema['maximum']}")
        if isinstance(value, list):
            if "minItems" in schema and len(value) < schema["minItems"]:
                self.add(path, f"should have at least {schema['minItems']} items")
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                self.add(path, f"may have at most {schema['maxItems']} items")
        if isinstance(value, dict):
            if "minProperties" in schema and len(value) < schema["minProperties"]:
                self.add(path, f"should have at least {schema['minProperties']} properties")
            if "maxProperties" in schema and len(value) > schema["maxProperties"]:
                self.add(path, f"may have at most {schema['maxProperties']} properties")
            for name in schema.get("required", []):
                if value.get(name) is None:
                    self.add([*path, name], "Required value")

    def _object(self, value: dict[str, Any], schema: dict[str, Any], path: list[str | int], *, structural: bool) -> None:
        properties: dict[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        for name, item in value.items():
            where = [*path, name]
            if name in properties:
                self.check(item, properties[name], where, structural=structural)
            elif isinstance(extra, dict):
                self.check(item, extra, where, structural=structural)
            elif embedded and name in ("apiVersion", "kind", "metadata"):
                if name != "metadata" and not isinstance(item, str):
                    self.add(where, f"{_short(item)} is not of type 'string'")
            elif structural and not preserve and extra is not True and schema.get("type") == "object":
                self.add(where, f'unknown field "{name}"')

    def _array(self, value: list[Any], schema: dict[str, Any], path: list[str | int], *, structural: bool) -> None:
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                self.check(item, items, [*path, index], structural=structural)
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set":
            seen: list[Any] = []
            for index, item in enumerate(value):
                if item in seen:
                    self.add([*path, index], f"Duplicate value: {_short(item)}")
                seen.append(item)
        elif list_type == "map":
            keys = schema.get("x-kubernetes-list-map-keys") or []
            seen_keys: set[str] = set()
            for index, item in enumerate(value):
                if not isinstance(item, dict):
                    continue
                key = json.dumps([item.get(k) for k in keys], sort_keys=True, default=str)
                if key in seen_keys:
                    self.add([*path, index], f"Duplicate value: {{{', '.join(f'{k}: {_short(item.get(k))}' for k in keys)}}}")
                seen_keys.add(key)


def validate(doc: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems of a custom resource against its version's schema, as (dotted path, message).
    The root ``metadata`` is left to the caller (ObjectMeta, checked with the Kubernetes schemas)."""
    checker = _Checker()
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    root = {
        **schema,
        "properties": {k: v for k, v in (schema.get("properties") or {}).items() if k not in ("apiVersion", "kind", "metadata")},
    }
    checker.check(body, root, [])
    return checker.problems
