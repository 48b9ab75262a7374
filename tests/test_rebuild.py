"""`ascendkit rebuild` recovers an image's inputs from its provenance, and refuses, before anything is
built, one whose inputs it cannot recover or which are not the ones at hand (the docker jobs rebuild
for real: tests/test_reproducible.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import InputError
from buildkit.matrix.load import load_matrix
from buildkit.ship.oci.registry import DOCKER_MANIFEST, OCI_MANIFEST, Manifest
from buildkit.ship.rebuild import check_inputs, is_local, local_original, recorded_inputs
from buildkit.trust.provenance import statement
from tests.conftest import TEST_MATRIX

WHERE = "registry.example/ml/verl@sha256:" + "a" * 64
LOCK = "locks/teststack/torch-x86_64.txt"


def record(**build: Any) -> dict[str, Any]:
    """A build manifest as ascendkit writes it, as far as the provenance reads it."""
    lock_sha = hashlib.sha256((TEST_MATRIX.parent / LOCK).read_bytes()).hexdigest()
    return {
        "stack": "teststack", "chip": "a3", "arch": "x86_64", "os": "debian12", "skus": ["a3"], "passed": True,
        "image": {"id": "sha256:" + "b" * 64}, "builder": {"name": "classic"},
        "build": {
            "base_image": {"ref": "ascendkit-standin/cann:x", "digest": "sha256:" + "c" * 64, "from_registry": False, "layers": 1},
            "lock_files": {LOCK: lock_sha},
            "reproducible": {"source_date_epoch": 1735689600, "label": "io.ascendkit.source-date-epoch"},
        } | build,
    }  # fmt: skip


def manifest(media_type: str = DOCKER_MANIFEST, layer: str = "application/vnd.docker.image.rootfs.diff.tar.gzip") -> Manifest:
    body = json.dumps({"mediaType": media_type, "layers": [{"mediaType": layer}]}).encode()
    return Manifest(WHERE.rpartition("@")[2], media_type, len(body), body)


def test_the_inputs_come_from_the_provenance_and_match_the_checkout_at_hand() -> None:
    inputs = recorded_inputs(statement("registry.example/ml/verl", WHERE, record()), WHERE, manifest())
    assert (inputs.stack, inputs.hw, inputs.arch, inputs.os, inputs.builder) == ("teststack", "a3", "x86_64", "debian12", "classic")
    assert (inputs.base_image, inputs.base_digest, inputs.base_from_registry) == ("ascendkit-standin/cann:x", "sha256:" + "c" * 64, False)
    assert (inputs.epoch, inputs.media_types, inputs.compression) == (1735689600, "default", "gzip")
    check_inputs(inputs, load_matrix(TEST_MATRIX))  # the test matrix and its locks are what it was built from
    zstd = recorded_inputs(statement("r", WHERE, record()), WHERE, manifest(OCI_MANIFEST, "application/vnd.oci.image.layer.v1.tar+zstd"))
    assert (zstd.media_types, zstd.compression) == ("default", "zstd")


@pytest.mark.parametrize(
    ("build", "said"),
    [
        ({"reproducible": None}, "records no epoch: it was built before ascendkit's images were reproducible"),
        ({"base_image": None}, "names no base image by digest"),
        ({"lock_files": {}}, "names no lock sections"),
    ],
)
def test_an_image_whose_inputs_cannot_be_recovered_is_refused(build: dict[str, Any], said: str) -> None:
    with pytest.raises(InputError, match=said):
        recorded_inputs(statement("r", WHERE, record(**build)), WHERE, manifest())


def test_inputs_that_are_not_the_ones_at_hand_are_refused(tmp_path: Path) -> None:
    loaded = load_matrix(TEST_MATRIX)
    other = recorded_inputs(statement("r", WHERE, record(lock_files={LOCK: "0" * 64})), WHERE, manifest())
    with pytest.raises(InputError, match=f"{LOCK} is not the lock section it was built from"):
        check_inputs(other, loaded)
    missing = recorded_inputs(statement("r", WHERE, record(lock_files={"locks/gone.txt": "0" * 64})), WHERE, manifest())
    with pytest.raises(InputError, match=r"built from lock section locks/gone\.txt, which is not here"):
        check_inputs(missing, loaded)
    data = record()
    data["stack"] = "nostack"
    with pytest.raises(InputError, match="built from stack 'nostack'"):
        check_inputs(recorded_inputs(statement("r", WHERE, data), WHERE, manifest()), loaded)


def test_a_bad_image_or_destination_is_refused_before_any_engine_is_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from buildkit.cli import app

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/ascendkit/none.sock")  # were it reached: exit 4, not 2
    bad = CliRunner().invoke(app, ["rebuild", "127.0.0.1:5000/Not A Ref!", "--to", "127.0.0.1:5000/scratch"])
    assert bad.exit_code == 2 and "give a registry image" in bad.output, bad.output
    local = CliRunner().invoke(app, ["rebuild", "ascendkit/verl:local", "--to", "127.0.0.1:5000/scratch"])
    assert local.exit_code == 4, "a local image: the engine it is on is asked for it"
    bad_to = CliRunner().invoke(app, ["rebuild", "127.0.0.1:5000/verl:x", "--to", "not a repository"])
    assert bad_to.exit_code == 2 and "not a repository" in bad_to.output, bad_to.output
    assert "--to 'not a repository'" in bad_to.output and "--registry" not in bad_to.output, "named as it was given"


def test_a_missing_image_is_named_as_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """HOST/REPO:TAG printed with its tag (``nope/verl:missing``), not as a digest (``nope/verl@missing``)."""
    from buildkit.errors import InputError
    from buildkit.ship.trust import checks

    class Empty:
        def __init__(self, host: str, timeout: float = 0.0) -> None:
            self.host = host

        def get_manifest(self, repository: str, reference: str) -> None:
            return None

    monkeypatch.setattr(checks, "Registry", Empty)
    for ref, said in (
        ("127.0.0.1:5000/nope/verl:missing", "127.0.0.1:5000/nope/verl:missing: the registry has no such image"),
        ("127.0.0.1:5000/nope/verl", "127.0.0.1:5000/nope/verl:latest: the registry has no such image"),
        (f"127.0.0.1:5000/nope/verl@sha256:{'a' * 64}", f"127.0.0.1:5000/nope/verl@sha256:{'a' * 64}: the registry has no"),
        (f"127.0.0.1:5000/nope/verl:v1@sha256:{'a' * 64}", f"127.0.0.1:5000/nope/verl:v1@sha256:{'a' * 64}: the registry has no"),
    ):
        with pytest.raises(InputError) as raised:
            checks.resolve(ref)
        assert str(raised.value).startswith(said), str(raised.value)


@pytest.mark.parametrize(
    ("ref", "local"),
    [
        ("ascendkit/verl:teststack-a3-debian12-x86_64", True),
        ("verl:x", True),
        ("127.0.0.1:5000/verl:x", False),
        ("registry.example/ml/verl@sha256:" + "a" * 64, False),
        ("localhost/verl:x", False),
    ],
)
def test_a_name_with_no_registry_host_is_an_image_on_this_engine(ref: str, local: bool) -> None:
    assert is_local(ref) is local


def test_a_local_image_is_rebuilt_from_its_build_record_as_publish_would_publish_it() -> None:
    """A local image's inputs are its record's, through the provenance publishing would attach; the
    media types and compression are publish's defaults."""
    inputs = recorded_inputs(statement("ascendkit/verl", "sha256:" + "b" * 64, record()), "ascendkit/verl:x", None)
    assert (inputs.stack, inputs.epoch, inputs.media_types, inputs.compression) == ("teststack", 1735689600, "default", "gzip")


class _Engine:
    """An engine holding one ascendkit image (as docker-py's APIClient answers inspect_image)."""

    def inspect_image(self, ref: str) -> dict[str, Any]:
        labels = {"org.opencontainers.image.version": "teststack-a3-debian12", "io.ascendkit.stack": "teststack"}
        return {"Id": "sha256:" + "b" * 64, "Architecture": "amd64", "Config": {"Labels": labels}}


def test_a_local_image_without_its_build_record_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no build manifest at .*teststack-a3-debian12-x86_64\.json.*its inputs cannot be recovered"):
        local_original(_Engine(), "ascendkit/verl:x", tmp_path)  # type: ignore[arg-type]
    failed = record() | {
        "schema_version": 1,
        "passed": False,
        "labels": {},
        "builder": {"name": "buildkit", "version": "0.13.1", "steps_total": 1, "steps_cached": 0},
    }
    failed["image"] = {"id": "sha256:" + "b" * 64, "tags": ["ascendkit/verl:x"]}
    (tmp_path / "teststack-a3-debian12-x86_64.json").write_text(json.dumps(failed))
    with pytest.raises(InputError, match="does not record a passed verification"):
        local_original(_Engine(), "ascendkit/verl:x", tmp_path)  # type: ignore[arg-type]
