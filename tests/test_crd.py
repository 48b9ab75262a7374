"""The vendored upstream CRDs are the files their release tags hold, and the strict validator honours
what a structural schema says the way the API server does (unknown fields, types, int-or-string,
enums, preserved fields, list keys)."""

from __future__ import annotations

from typing import Any

import pytest

from buildkit.k8s import KRUISE_VERSION, KUBERAY_VERSION, KYVERNO_VERSION, POLICY_CONTROLLER_VERSION, VOLCANO_VERSION
from buildkit.k8s.crd import crd_for, crds, sha256_of, sources, unchecked_rules, validate


@pytest.mark.parametrize("entry", sources(), ids=lambda e: e["file"])
def test_each_vendored_crd_is_the_recorded_upstream_file(entry: dict[str, str]) -> None:
    assert sha256_of(entry["file"]) == entry["sha256"], f"{entry['file']} changed: re-vendor it from {entry['repository']} {entry['tag']}"
    assert len(entry["commit"]) == 40 and entry["tag"].startswith("v")
    assert (entry["group"], entry["kind"]) in crds()


def test_the_versions_named_in_the_cli_are_the_vendored_tags() -> None:
    tags = {e["kind"] + "@" + e["group"]: e["tag"] for e in sources()}
    assert tags == {
        "RayJob@ray.io": KUBERAY_VERSION,
        "Job@batch.volcano.sh": VOLCANO_VERSION,
        "ClusterPolicy@kyverno.io": KYVERNO_VERSION,
        "ClusterImagePolicy@policy.sigstore.dev": POLICY_CONTROLLER_VERSION,
        "ImagePullJob@apps.kruise.io": KRUISE_VERSION,
        "NodeImage@apps.kruise.io": KRUISE_VERSION,
    }


def test_crd_for_finds_served_versions_only() -> None:
    crd, schema = crd_for("ray.io/v1", "RayJob")
    assert crd is not None and schema
    crd, schema = crd_for("ray.io/v2", "RayJob")
    assert crd is not None and schema == {}, "known kind, unserved version"
    assert crd_for("apps/v1", "Deployment") == (None, None)


def test_the_cel_rules_left_unevaluated_are_on_fields_ascendkit_never_writes() -> None:
    _, schema = crd_for("ray.io/v1", "RayJob")
    assert schema is not None
    assert unchecked_rules(schema) == [
        "spec.deletionStrategy",
        "spec.deletionStrategy.deletionRules[].condition",
        "spec.managedBy",
        "spec.rayClusterSpec.gcsFaultToleranceOptions.backend",
        "spec.rayClusterSpec.managedBy",
    ]


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "properties": {
                "size": {"type": "integer", "format": "int32"},
                "port": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "mode": {"type": "string", "enum": ["hard", "soft"]},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"n": {"type": "integer"}}},
                "maybe": {"type": "string", "nullable": True},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "ports": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}},
                },
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                "ratio": {"type": "number", "minimum": 0, "maximum": 1},
                "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
            },
        }
    },
}


@pytest.mark.parametrize(
    ("spec", "problems"),
    [
        ({"size": 1}, []),
        ({"size": 1, "port": 80}, []),
        ({"size": 1, "port": "http"}, []),
        ({"size": 1, "port": 1.5}, [("spec.port", "1.5 is neither an integer nor a string")]),
        ({"size": True}, [("spec.size", "true is not of type 'integer'")]),
        ({"size": 2**31}, [("spec.size", "2147483648 is out of the int32 range")]),
        ({"size": "1"}, [("spec.size", "'1' is not of type 'integer'")]),
        ({}, [("spec.size", "Required value")]),
        ({"size": 1, "mode": "strict"}, [("spec.mode", 'Unsupported value: \'strict\': supported values: "hard", "soft"')]),
        ({"size": 1, "free": {"anything": [1, {"x": 2}], "n": 3}}, []),
        ({"size": 1, "free": {"n": "three"}}, [("spec.free.n", "'three' is not of type 'integer'")]),
        ({"size": 1, "maybe": None, "labels": {"a": "b"}}, []),
        ({"size": 1, "labels": {"a": 1}}, [("spec.labels.a", "1 is not of type 'string'")]),
        ({"size": 1, "ports": [{"name": "a"}, {"name": "a", "n": 2}]}, [("spec.ports.1", "Duplicate value: {name: 'a'}")]),
        ({"size": 1, "tags": ["x", "x"]}, [("spec.tags.1", "Duplicate value: 'x'")]),
        ({"size": 1, "ratio": 1}, []),
        ({"size": 1, "ratio": 2.5}, [("spec.ratio", "should be less than or equal to 1")]),
        ({"size": 1, "name": "abcdef"}, [("spec.name", "may not be more than 5 characters (6)")]),
        ({"size": 1, "name": "ab1"}, [("spec.name", "'ab1' does not match '^[a-z]+$'")]),
        ({"size": 1, "sise": 2}, [("spec.sise", 'unknown field "sise"')]),
        ({"size": 1, "ports": [{"name": "a", "nn": 1}]}, [("spec.ports.0.nn", 'unknown field "nn"')]),
    ],
)
def test_the_validator_honours_the_structural_schema(spec: dict[str, Any], problems: list[tuple[str, str]]) -> None:
    doc = {"apiVersion": "x.io/v1", "kind": "X", "metadata": {"name": "x"}, "spec": spec}
    assert validate(doc, SCHEMA) == problems


def test_an_unknown_top_level_field_is_refused_and_status_is_declared() -> None:
    _, schema = crd_for("batch.volcano.sh/v1alpha1", "Job")
    assert schema is not None
    doc = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "x"}, "spec": {}, "sepc": {}}
    assert validate(doc, schema) == [("sepc", 'unknown field "sepc"')]
