"""The SBOM document (against the CycloneDX 1.6 schema), its diff, and attaching it to an image digest."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from buildkit.errors import InputError
from buildkit.image.sbom import BaseImage, diff, dumps, entries, loads, lock_hashes, sbom_document
from buildkit.image.verify import ImageFacts
from buildkit.matrix.load import load_matrix
from buildkit.plan import plan_image, plan_target
from buildkit.ship.oci.registry import OCI_MANIFEST, Registry
from buildkit.ship.trust.attach import attach_sbom, check_sbom_ref, fallback_tag, fetch_sbom, image_digest
from tests.conftest import TEST_MATRIX
from tests.harness.fake_registry import fake_registry

HASH = "a" * 64
LOCK = f"""# ascendkit lock section: layer torch (generated)
# status: resolved
tomli==2.0.0 \\
    --hash=sha256:{HASH} \\
    --hash=sha256:{"b" * 64}
    # index: pypi-again
idna==3.7 \\
    --hash=sha256:{"c" * 64}
    # index: pypi
"""


def facts(**changes: Any) -> ImageFacts:
    base = ImageFacts(
        image_id="sha256:" + "1" * 64,
        architecture="amd64",
        labels={},
        python="3.11.2",
        machine="x86_64",
        packages={"tomli": "2.0.0", "idna": "3.7", "pip": "23.0.1"},
        os_release={"ID": "debian", "VERSION_ID": "12", "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"},
        cann_version="8.3.RC1",
        cann_source="/usr/local/Ascend/ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info",
        env={},
        created="2026-11-23T10:11:12.123456789Z",
        os_packages={"dpkg": "bash\t5.2.15-2+b2\tamd64\nlibc6\t2.36-9+deb12u9\tamd64\n"},
        git_revisions="",
        locks={"/etc/ascendkit/locks/torch-x86_64.txt": LOCK},
    )
    return replace(base, **changes)


def validate(document: dict[str, Any]) -> None:
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(dumps(document))
    assert error is None, str(getattr(error, "data", error))[:2000]


@pytest.fixture(scope="module")
def test_plan() -> Any:
    loaded = load_matrix(TEST_MATRIX)
    return plan_image(loaded, plan_target(loaded, "a3", None, None), "x86_64")


BASE = BaseImage("ascendkit-standin/cann:8.3.rc1-a3-debian12-py3.11", "sha256:" + "2" * 64, False)


def test_document_is_valid_cyclonedx_1_6_with_every_kind(test_plan: Any) -> None:
    document = sbom_document(facts(), test_plan, BASE, "ascendkit/verl")
    validate(document)
    assert document["specVersion"] == "1.6"
    by_ref = {c["bom-ref"]: c for c in document["components"]}
    tomli = by_ref["pypi:tomli"]
    assert tomli["purl"] == "pkg:pypi/tomli@2.0.0"
    assert [h["content"] for h in tomli["hashes"]] == [HASH, "b" * 64]  # the lock's hashes, as the image holds them
    assert {"name": "ascendkit:component", "value": "torch"} in tomli["properties"]  # the test stack's torch is tomli
    assert "hashes" not in by_ref["pypi:pip"]  # not locked: no hash claimed
    assert by_ref["deb:bash"]["purl"] == "pkg:deb/debian/bash@5.2.15-2%2Bb2?arch=amd64&distro=debian-12"
    assert by_ref["cann:toolkit"]["version"] == "8.3.RC1"
    base = by_ref["base:image"]
    assert base["version"] == BASE.digest and base["type"] == "container"
    assert base["purl"].startswith("pkg:oci/cann@sha256%3A" + "2" * 64 + "?repository_url=ascendkit-standin/cann&tag=8.3.rc1")
    assert document["metadata"]["timestamp"] == "2026-11-23T10:11:12Z"
    assert document["dependencies"][0]["dependsOn"] == [c["bom-ref"] for c in document["components"]]


def test_document_is_deterministic(test_plan: Any) -> None:
    one = dumps(sbom_document(facts(), test_plan, BASE, "ascendkit/verl"))
    assert one == dumps(sbom_document(facts(), test_plan, BASE, "ascendkit/verl"))
    other = dumps(sbom_document(facts(image_id="sha256:" + "3" * 64), test_plan, BASE, "ascendkit/verl"))
    assert json.loads(one)["serialNumber"] != json.loads(other)["serialNumber"]


def test_rpm_and_git_checkouts(loaded: Any) -> None:
    plan = plan_image(loaded, plan_target(loaded, "a3", "cann8.5", "openeuler24.03"), "aarch64")
    commit = "0123456789abcdef0123456789abcdef01234567"
    rpm = "bash\t0:5.2.15-9.oe2403\taarch64\nopenssl\t1:3.0.12-5.oe2403\taarch64\n"
    found = facts(
        os_release={"ID": "openEuler", "VERSION_ID": "24.03"},
        os_packages={"rpm": rpm},
        git_revisions=f"megatron-lm core_v0.12.1 {commit}\nmindspeed 2.3.0_core_r0.12.1 {'f' * 40}\n",
        machine="aarch64",
    )
    document = sbom_document(found, plan, BASE, "ascendkit/verl")
    validate(document)
    by_ref = {c["bom-ref"]: c for c in document["components"]}
    assert by_ref["rpm:openssl"]["purl"] == "pkg:rpm/openeuler/openssl@3.0.12-5.oe2403?arch=aarch64&distro=openeuler-24.03&epoch=1"
    assert by_ref["rpm:bash"]["purl"].endswith("distro=openeuler-24.03")  # epoch 0 is not a qualifier
    megatron = by_ref["git:megatron-lm"]
    assert megatron["version"] == commit and megatron["purl"] == f"pkg:github/nvidia/megatron-lm@{commit}"
    assert {"name": "ascendkit:git-ref", "value": "core_v0.12.1"} in megatron["properties"]
    assert by_ref["git:mindspeed"]["purl"].startswith(f"pkg:generic/mindspeed@{'f' * 40}?vcs_url=git%2Bhttps")


def test_the_schemas_iri_formats_are_checked_by_a_jsonschema_that_imports_fast(loaded: Any) -> None:
    """CycloneDX 1.6 writes every URL as an ``iri-reference``: the validator above checks them (a checkout
    URL with a space is refused), through rfc3987 rather than rfc3987-syntax, whose import builds a
    parser for over a second in every process that imports jsonschema (pyproject.toml's dev list)."""
    plan = plan_image(loaded, plan_target(loaded, "a3", "cann8.5", "openeuler24.03"), "aarch64")
    bad = replace(plan, git_checkouts=tuple(replace(c, path=c.path + "/a b") for c in plan.git_checkouts))
    document = sbom_document(facts(git_revisions=f"megatron-lm core_v0.12.1 {'0' * 40}\n"), bad, BASE, "ascendkit/verl")
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(dumps(document))
    assert error is not None and "iri-reference" in str(getattr(error, "data", error))
    probe = "import sys, jsonschema; print('rfc3987_syntax' in sys.modules, 'rfc3987' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split() == ["False", "True"]


def test_a_framework_from_a_checkout_and_a_patched_package(loaded: Any) -> None:
    """OpenRLHF built from the fork's commit: a PyPI name and version, but its purl says which source;
    vllm-ascend with a line commented out: its pedigree carries the diff and the reason."""
    plan = plan_image(loaded, plan_target(loaded, "a2", "openrlhf-cann8.1", None), "aarch64")
    commit = "06ac74cf1ea896c379ef4cb6a39dbd8488fb16fd"
    diff_text = "--- a/vllm_ascend/platform.py\n+++ b/vllm_ascend/platform.py\n@@ -48 +48 @@\n-os.environ[...]\n+# ascendkit patch ...\n"
    record = {
        "package": "vllm_ascend",
        "version": "0.8.5rc1",
        "file": "vllm_ascend/platform.py",
        "line": 48,
        "comment_out": 'os.environ["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] = "1"',
        "reason": "device error",
        "diff": diff_text,
    }
    found = facts(
        packages={"openrlhf": "0.7.5", "vllm-ascend": "0.8.5rc1"},
        git_revisions=f"openrlhf {commit} {commit}\n",
        patches=(record,),
        machine="aarch64",
    )
    document = sbom_document(found, plan, BASE, "ascendkit/openrlhf")
    validate(document)
    by_ref = {c["bom-ref"]: c for c in document["components"]}
    framework = by_ref["pypi:openrlhf"]
    assert framework["purl"] == f"pkg:pypi/openrlhf@0.7.5?vcs_url=git%2Bhttps%3A%2F%2Fgithub.com%2Fzhuo97%2FOpenRLHF.git%40{commit}"
    props = {p["name"]: p["value"] for p in framework["properties"]}
    assert props == {"ascendkit:component": "openrlhf", "ascendkit:source": f"git https://github.com/zhuo97/OpenRLHF.git@{commit}"}
    assert by_ref["git:openrlhf"]["purl"] == f"pkg:github/zhuo97/openrlhf@{commit}"
    patched = by_ref["pypi:vllm-ascend"]
    diff = {"text": {"contentType": "text/x-diff", "content": diff_text}}
    assert patched["pedigree"]["patches"] == [{"type": "unofficial", "diff": diff}]
    assert patched["pedigree"]["notes"] == "vllm_ascend/platform.py line 48 commented out: device error"
    assert {"name": "ascendkit:patched", "value": "yes"} in patched["properties"]
    shown = {e.name: e.detail for e in entries(document)}
    assert shown["vllm-ascend"] == "vllm_ascend, patched" and shown["openrlhf"] == "openrlhf"


def test_lock_hashes_follow_their_requirement() -> None:
    assert lock_hashes({"a": LOCK}) == {"tomli": {"2.0.0": [HASH, "b" * 64]}, "idna": {"3.7": ["c" * 64]}}


def test_diff_lists_exactly_what_changed(test_plan: Any) -> None:
    before = sbom_document(facts(), test_plan, BASE, "ascendkit/verl")
    after_facts = facts(
        packages={"tomli": "2.0.0", "idna": "3.6", "wheel": "0.45.1"},
        os_packages={"dpkg": "bash\t5.2.15-2+b2\tamd64\n"},
        cann_version="8.5.0",
    )
    change = diff(before, sbom_document(after_facts, test_plan, BASE, "ascendkit/verl"))
    assert [(a.name, a.version, b.version) for a, b in change.changed] == [("cann-toolkit", "8.3.RC1", "8.5.0"), ("idna", "3.7", "3.6")]
    assert [(e.kind, e.name) for e in change.added] == [("python", "wheel")]
    assert [(e.kind, e.name) for e in change.removed] == [("os", "libc6"), ("python", "pip")]
    assert change.describe()["changed"][1] == {"kind": "python", "name": "idna", "from": "3.7", "to": "3.6", "pin": "verl"}
    assert diff(before, before).describe() == {"added": [], "removed": [], "changed": []}


def test_entries_and_loads(test_plan: Any) -> None:
    document = sbom_document(facts(), test_plan, BASE, "ascendkit/verl")
    kinds = {e.kind for e in entries(document)}
    assert kinds == {"python", "os", "cann", "base image"}
    with pytest.raises(InputError, match="not a CycloneDX document"):
        loads(b'{"spdxVersion": "SPDX-2.3"}', "x")
    with pytest.raises(InputError, match="not JSON"):
        loads(b"<html>", "x")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("Bad Image!!", "not an image reference"),
        ("127.0.0.1:5000/x@sha256:short", "not an image reference"),
        ("verl@sha256:" + "a" * 64, "read from its registry"),
    ],
)
def test_bad_references_are_refused_before_any_contact(ref: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        check_sbom_ref(ref)


def _push_image(registry: Registry, repository: str, arch: str) -> str:
    config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    digest = registry.put_blob(repository, config)
    body = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest, "size": len(config)},
            "layers": [],
        }
    ).encode()
    return registry.put_manifest(repository, f"img-{arch}", body, OCI_MANIFEST)


@pytest.mark.parametrize("referrers", [True, False])
def test_attach_and_fetch_by_referrers_or_tag(referrers: bool) -> None:
    sbom = dumps({"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "components": []}).encode()
    with fake_registry(referrers=referrers) as (host, store):
        registry = Registry(host, retries=0)
        digest = _push_image(registry, "ml/verl", "amd64")
        subject = registry.get_manifest("ml/verl", digest)
        assert subject is not None
        attached = attach_sbom(registry, "ml/verl", subject, sbom)
        tagged = ("ml/verl", fallback_tag(digest)) in store.tags
        if referrers:
            assert attached.how == "referrer" and not tagged  # linked by its subject: no tag needed
        else:
            assert attached.how == f"tag sha256-{digest.removeprefix('sha256:')}.sbom" and tagged
        assert attached.digest == "sha256:" + hashlib.sha256(store.manifests[attached.digest][1]).hexdigest()
        assert fetch_sbom(registry, "ml/verl", digest) == sbom
        assert attach_sbom(registry, "ml/verl", subject, sbom) == attached  # idempotent
        other = _push_image(registry, "ml/verl", "arm64")
        assert fetch_sbom(registry, "ml/verl", other) is None


def test_index_member_digest() -> None:
    with fake_registry(referrers=False) as (host, _):
        registry = Registry(host, retries=0)
        amd, arm = _push_image(registry, "r", "amd64"), _push_image(registry, "r", "arm64")
        members = [
            {"mediaType": OCI_MANIFEST, "digest": d, "size": 1, "platform": {"architecture": a, "os": "linux"}}
            for a, d in (("amd64", amd), ("arm64", arm))
        ]
        body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": members}).encode()
        index = registry.put_manifest("r", "multi", body, "application/vnd.oci.image.index.v1+json")
        assert image_digest(registry, "r", index, "aarch64") == arm
        assert image_digest(registry, "r", amd, None) == amd
        with pytest.raises(InputError, match=r"multi-arch index .*give --arch"):
            image_digest(registry, "r", index, None)


def test_production_matrix_plans_have_roles(loaded: Any) -> None:
    plan = plan_image(loaded, plan_target(loaded, "a3", None, None), "aarch64")
    document = sbom_document(facts(packages={"torch-npu": "2.7.1", "torch": "2.7.1"}), plan, BASE, "ascendkit/verl")
    roles = {e.name: e.detail for e in entries(document) if e.kind == "python"}
    assert roles == {"torch": "torch", "torch-npu": "torch_npu"}
