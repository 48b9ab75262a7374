"""``ascendkit k8s validate``: manifests against the Kubernetes schemas and KubeRay's RayJob fields."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit.errors import InputError
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


def _validate_core(doc: dict[str, Any]) -> list[tuple[str, str]]:
    import kubernetes_validate as kv

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
    name = str((doc.get("metadata") or {}).get("name", ""))
    if len(name) > RAYJOB_NAME_MAX:
        problems.append(("metadata.name", f"KubeRay {KUBERAY_VERSION} allows at most {RAYJOB_NAME_MAX} characters"))
    cluster = (doc.get("spec") or {}).get("rayClusterSpec") or {}
    templates = [("spec.rayClusterSpec.headGroupSpec.template", (cluster.get("headGroupSpec") or {}).get("template"))]
    templates += [
        (f"spec.rayClusterSpec.workerGroupSpecs.{i}.template", group.get("template"))
        for i, group in enumerate(cluster.get("workerGroupSpecs") or [])
    ]
    templates.append(("spec.submitterPodTemplate", (doc.get("spec") or {}).get("submitterPodTemplate")))
    for where, template in templates:
        if template is None:
            continue
        wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
        problems += [
            (f"{where}.{path.removeprefix('template').lstrip('.')}".rstrip("."), message) for path, message in _validate_core(wrapper)
        ]
    return problems


def validate_documents(docs: list[dict[str, Any]]) -> list[Problem]:
    problems = []
    for index, doc in enumerate(docs, start=1):
        kind, name = str(doc.get("kind", "?")), str((doc.get("metadata") or {}).get("name", "?"))
        found = _validate_rayjob(doc) if doc.get("apiVersion") == "ray.io/v1" and kind == "RayJob" else _validate_core(doc)
        problems += [Problem(index, kind, name, path, message) for path, message in found]
    return problems


def validate_file(path: Path) -> tuple[int, list[Problem]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(f"{path}: not JSON: {exc}") from None
        docs = data.get("items", []) if isinstance(data, dict) and data.get("kind") == "List" else [data]
    else:
        docs = as_documents(text, str(path))
    return len(docs), validate_documents(docs)
