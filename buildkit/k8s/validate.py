"""``ascendkit k8s validate``: manifests against the Kubernetes schemas and KubeRay's RayJob fields."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit.errors import InputError
from buildkit.fsio import read_input_text
from buildkit.k8s import KUBERAY_VERSION, KUBERNETES_VERSION
from buildkit.k8s.render import RAYJOB_NAME_MAX, as_documents
from buildkit.resources import TEMPLATES_DIR

RAYJOB_SCHEMA_FILE = TEMPLATES_DIR / "k8s" / "rayjob.schema.json"


@dataclass(frozen=True)
class Problem:
    document: int
    kind: str
    name: str
    path: str
    message: str

    def format(self, source: str) -> str:
        where = f"{source}: document {self.document} ({self.kind} {self.name})"
        return f"{where}: {self.path or '(top)'}: {self.message}"


def _mapping(value: Any) -> dict[str, Any]:
    """A part of a document that should be a mapping (its shape is the schema's to judge, not a crash)."""
    return value if isinstance(value, dict) else {}


def _validate_core(doc: dict[str, Any]) -> list[tuple[str, str]]:
    import kubernetes_validate as kv

    if not isinstance(doc.get("apiVersion"), str) or not isinstance(doc.get("kind"), str):
        return [("", "apiVersion and kind must be strings")]

    try:
        kv.validate(doc, KUBERNETES_VERSION, strict=True)
    except kv.ValidationError as exc:
        return [(".".join(str(p) for p in exc.path), exc.message)]
    except kv.SchemaNotFoundError:
        return [("", f"{doc.get('apiVersion')}/{doc.get('kind')} is not in the Kubernetes {KUBERNETES_VERSION} schemas")]
    return []


@functools.cache
def _rayjob_validator() -> Any:
    import jsonschema

    return jsonschema.Draft7Validator(json.loads(RAYJOB_SCHEMA_FILE.read_text(encoding="utf-8")))


def _validate_rayjob(doc: dict[str, Any]) -> list[tuple[str, str]]:
    problems = [
        (".".join(str(p) for p in err.absolute_path), err.message)
        for err in sorted(_rayjob_validator().iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    ]
    name = str(_mapping(doc.get("metadata")).get("name", ""))
    if len(name) > RAYJOB_NAME_MAX:
        problems.append(("metadata.name", f"KubeRay {KUBERAY_VERSION} allows at most {RAYJOB_NAME_MAX} characters"))
    spec = _mapping(doc.get("spec"))
    cluster = _mapping(spec.get("rayClusterSpec"))
    groups = cluster.get("workerGroupSpecs")
    templates = [("spec.rayClusterSpec.headGroupSpec.template", _mapping(cluster.get("headGroupSpec")).get("template"))]
    templates += [
        (f"spec.rayClusterSpec.workerGroupSpecs.{i}.template", _mapping(group).get("template"))
        for i, group in enumerate(groups if isinstance(groups, list) else [])
    ]
    templates.append(("spec.submitterPodTemplate", spec.get("submitterPodTemplate")))
    for where, template in templates:
        if not isinstance(template, dict):
            continue  # absent, or the wrong shape: the RayJob schema above has said so
        wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
        problems += [
            (f"{where}.{path.removeprefix('template').lstrip('.')}".rstrip("."), message) for path, message in _validate_core(wrapper)
        ]
    return problems


def validate_documents(docs: list[dict[str, Any]]) -> list[Problem]:
    problems = []
    for index, doc in enumerate(docs, start=1):
        kind, name = str(doc.get("kind", "?")), str(_mapping(doc.get("metadata")).get("name", "?"))
        found = _validate_rayjob(doc) if doc.get("apiVersion") == "ray.io/v1" and kind == "RayJob" else _validate_core(doc)
        problems += [Problem(index, kind, name, path, message) for path, message in found]
    return problems


def validate_file(path: Path) -> tuple[int, list[Problem]]:
    text = read_input_text(path, "manifest file")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(f"{path}: not JSON: {exc}") from None
        docs = data.get("items", []) if isinstance(data, dict) and data.get("kind") == "List" else [data]
        if not isinstance(docs, list) or not all(isinstance(d, dict) for d in docs):
            raise InputError(f"{path}: expected a JSON object, or a List whose items are objects")
    else:
        docs = as_documents(text, str(path))
    return len(docs), validate_documents(docs)
