"""``ascendkit k8s validate``: built-in kinds against the Kubernetes OpenAPI schemas, custom
resources (KubeRay RayJob, Volcano Job) against their vendored upstream CRDs (``crd.py``), their
metadata as ObjectMeta and their pod templates against the Kubernetes schemas too."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildkit.errors import InputError
from buildkit.fsio import read_input_text
from buildkit.k8s import KUBERNETES_VERSION
from buildkit.k8s.crd import Crd, crd_for
from buildkit.k8s.crd import validate as crd_validate
from buildkit.k8s.render import as_documents
from buildkit.k8s.request import RAYJOB_NAME_MAX


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


@functools.cache
def _kubernetes_validate() -> Any:  # the module (untyped)
    """kubernetes_validate, reading each schema file once per process: its ``validate`` lists its schema
    directory twice and parses the kind's schema and the 1.8 MB ``_definitions.json`` on every call
    (11 ms, for every document and every pod template). The files are package data that never change
    while we run, and nothing it does with them writes to them."""
    import kubernetes_validate as kv
    import kubernetes_validate.utils as utils

    utils.schema_contents = functools.cache(utils.schema_contents)
    utils.all_versions = functools.cache(utils.all_versions)
    return kv


def _validate_core(doc: dict[str, Any]) -> list[tuple[str, str]]:
    kv = _kubernetes_validate()

    if not isinstance(doc.get("apiVersion"), str) or not isinstance(doc.get("kind"), str):
        return [("", "apiVersion and kind must be strings")]

    try:
        kv.validate(doc, KUBERNETES_VERSION, strict=True)
    except kv.ValidationError as exc:
        return [(".".join(str(p) for p in exc.path), exc.message)]
    except kv.SchemaNotFoundError:
        return [("", f"{doc.get('apiVersion')}/{doc.get('kind')} is not in the Kubernetes {KUBERNETES_VERSION} schemas")]
    return []


def _validate_metadata(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """A custom resource's metadata is an ObjectMeta: checked as a core object's would be."""
    wrapper = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata")}
    return [(path, message) for path, message in _validate_core(wrapper) if path.startswith("metadata") or not path]


def pod_templates(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    """The pod templates a custom resource carries, each with its path (absent or malformed ones
    too): the CRD checks their shape, the Kubernetes schemas what a pod made from them must be
    (what the operator's create would be refused for). tests/harness/scan.py hands them to checkov."""
    spec = _mapping(doc.get("spec"))
    if doc.get("kind") == "RayJob":
        cluster = _mapping(spec.get("rayClusterSpec"))
        groups = cluster.get("workerGroupSpecs")
        found = [("spec.rayClusterSpec.headGroupSpec.template", _mapping(cluster.get("headGroupSpec")).get("template"))]
        found += [
            (f"spec.rayClusterSpec.workerGroupSpecs.{i}.template", _mapping(group).get("template"))
            for i, group in enumerate(groups if isinstance(groups, list) else [])
        ]
        return [*found, ("spec.submitterPodTemplate", spec.get("submitterPodTemplate"))]
    tasks = spec.get("tasks")
    return [(f"spec.tasks.{i}.template", _mapping(task).get("template")) for i, task in enumerate(tasks if isinstance(tasks, list) else [])]


def _validate_custom(doc: dict[str, Any], crd: Crd, schema: dict[str, Any]) -> list[tuple[str, str]]:
    if not schema:
        served = ", ".join(f"{crd.group}/{v}" for v in crd.versions)
        return [("apiVersion", f"{doc.get('apiVersion')} is not served by the {crd.label}; one of {served}")]
    problems = _validate_metadata(doc) + crd_validate(doc, schema)
    name = str(_mapping(doc.get("metadata")).get("name", ""))
    if doc.get("kind") == "RayJob" and len(name) > RAYJOB_NAME_MAX:
        problems.append(
            ("metadata.name", f"KubeRay allows at most {RAYJOB_NAME_MAX} characters (it adds suffixes for the cluster and services)")
        )
    for where, template in pod_templates(doc):
        if not isinstance(template, dict) or any(path.startswith(where) for path, _ in problems):
            continue  # absent, the wrong shape, or already faulted by the CRD: one report per mistake
        wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
        problems += [
            (f"{where}.{path.removeprefix('template').lstrip('.')}".rstrip("."), message) for path, message in _validate_core(wrapper)
        ]
    return sorted(set(problems), key=lambda p: (p[0], p[1]))


def validate_documents(docs: list[dict[str, Any]]) -> list[Problem]:
    problems = []
    for index, doc in enumerate(docs, start=1):
        kind, name = str(doc.get("kind", "?")), str(_mapping(doc.get("metadata")).get("name", "?"))
        crd, schema = crd_for(str(doc.get("apiVersion", "")), kind)
        found = _validate_custom(doc, crd, schema) if crd is not None and schema is not None else _validate_core(doc)
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
    if not docs:
        raise InputError(f"{path}: no Kubernetes objects in it (empty, or only null documents): nothing to validate")
    return len(docs), validate_documents(docs)
