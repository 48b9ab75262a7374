"""Same inputs, same image: two clean builds of the test stack (``--no-cache``, BuildKit's cache mounts
pruned first, so every package is fetched and every sdist built again, minutes apart) publish the same
config and the same gzip and zstd manifests, on every engine this runs on: Docker 26.1.5 with the
containerd store (the docker-b job: it shares no image with the rest), on overlay2 and Docker 20.10
with the classic builder (their jobs); and for aarch64, every step under qemu, on the emulated engine
(the emulated job). The second build is `ascendkit rebuild` of the first, from the inputs its provenance records, as a user
checks a published image; on overlay2 the first is not published, and `rebuild` takes it from the engine and
its build record, as a user checks an image before publishing it.

Each job writes what it published to ``$ASCENDKIT_SERVICES_DIR/reproducible/<engine>.json``; CI's
``reproduced`` job (tests/harness/reproduced.py) then holds the engines to one image (the classic builder to
BuildKit's layers). Where
the two builds differ, `ascendkit diff` names every differing file and its layer in the failure."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, cast

import pytest

from buildkit.ship.oci.registry import Registry
from tests.conftest import TEST_MATRIX, DockerEnv, arm64_standin
from tests.harness.services import STATE

pytestmark = [pytest.mark.docker, pytest.mark.engine_20_10, pytest.mark.engine_overlay2]

RESULTS = STATE / "reproducible"


def engine_name(docker_env: DockerEnv) -> str:
    """This engine's name among the services' (docker-b, docker-20.10, docker-overlay2, ...)."""
    return os.environ.get("ASCENDKIT_ENGINE_NAME") or str(docker_env.client.info().get("Name") or "engine")


def clean_build(docker_env: DockerEnv, workdir: Path, repository: str, arch: str, base: str, *builder: str) -> dict[str, Any]:
    """A build of the test stack with nothing cached (its steps, BuildKit's cache mounts), published gzip and zstd."""
    docker_env.client.prune_builds(filters=cast(Any, {"type": ["exec.cachemount"]}), all=True)  # the stubs know two filters
    workdir.mkdir()
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", arch, "--matrix", str(TEST_MATRIX), "--base-image", base,
        "--no-cache", "--push", "--registry", repository, "--compression", "zstd", "--no-index", "--json", "--quiet", *builder,
        cwd=workdir, check=True,
    )  # fmt: skip
    return _published(json.loads(proc.stdout), repository, workdir)


def _published(result: dict[str, Any], repository: str, workdir: Path) -> dict[str, Any]:
    record = json.loads((workdir / result["manifest"]).read_text(encoding="utf-8"))  # the path is relative to the build's directory
    published = record["published"]
    entry = published["registries"][repository]
    return {
        "ref": (result.get("pushed") or [{}])[0].get("ref", ""),
        "repository": repository,
        "builder": (record.get("builder") or {}).get("name", ""),
        "engine_config": record["image"]["id"],
        "config": published.get("config", ""),
        "gzip": entry["gzip"]["digest"],
        "zstd": entry["zstd"]["digest"],
        "reproducible": published.get("reproducible"),
        "epoch": record["build"].get("reproducible"),
    }


def test_two_clean_builds_publish_the_same_image(docker_env: DockerEnv, tmp_path: Path) -> None:
    name = engine_name(docker_env)
    if name == "docker-overlay2":  # one engine rebuilds a local image: the same builds, the other way in
        first = reproduced_locally(docker_env, tmp_path)
    else:
        # Docker 20.10 is where users still run the classic builder: held to it there (its rebuild takes the recorded builder)
        builder = ("--builder", "classic") if name == "docker-20.10" else ()
        first = reproduced(docker_env, tmp_path, "x86_64", docker_env.standin, *builder)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"engine": name, **first}, indent=2))


@pytest.mark.emulated
@pytest.mark.arm64_pair  # `make repro-arm64`, not `make test`: see the marker
def test_two_clean_arm64_builds_under_emulation_publish_the_same_image(docker_env: DockerEnv, tmp_path: Path) -> None:
    """The same for aarch64, the SKU hosts' arch: every step run under qemu on the emulated engine."""
    first = reproduced(docker_env, tmp_path, "aarch64", arm64_standin())
    assert first["arch"] == "aarch64"


def reproduced_locally(docker_env: DockerEnv, tmp_path: Path) -> dict[str, Any]:
    """A clean build left on the engine, unpublished; `ascendkit rebuild` of the local image publishes it and its
    rebuild to a scratch repository and compares; the image's own tag and build record stay as they were."""
    scratch = f"{docker_env.registry}/repro-{uuid.uuid4().hex[:8]}"
    docker_env.client.prune_builds(filters=cast(Any, {"type": ["exec.cachemount"]}), all=True)
    first_dir = tmp_path / "first"
    first_dir.mkdir()
    built = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin,
        "--no-cache", "--repo", "ascendkit-repro/verl", "--json", "--quiet", cwd=first_dir, check=True,
    )  # fmt: skip
    result = json.loads(built.stdout)
    tag, record_path = result["tags"][0], first_dir / result["manifest"]
    record_before, image_before = record_path.read_bytes(), docker_env.client.inspect_image(tag)["Id"]
    docker_env.client.prune_builds(filters=cast(Any, {"type": ["exec.cachemount"]}), all=True)
    checked = docker_env.ascendkit(
        "rebuild", tag, "--to", scratch, "--manifest-dir", str(record_path.parent), "--matrix", str(TEST_MATRIX), "--json", "--quiet",
        cwd=tmp_path,
    )  # fmt: skip
    assert checked.returncode in (0, 1), f"rebuild could not run:\n{checked.stderr[-4000:]}"
    outcome = json.loads(checked.stdout)
    assert record_path.read_bytes() == record_before, "a scratch push is not a publication: the record stays as it was"
    assert docker_env.client.inspect_image(tag)["Id"] == image_before, "the image's tag stays on it"
    rebuilt_tag = outcome["build"]["tags"][0]
    assert rebuilt_tag.startswith("ascendkit-repro/verl-rebuilt:"), rebuilt_tag
    assert (record_path.parent / "rebuilt" / record_path.name).is_file(), "the rebuild's record apart from the original's"
    second = _published(outcome["build"], scratch, tmp_path)
    original = outcome["original"].rpartition("@")[2]
    config = Registry(docker_env.registry).get_manifest(scratch.split("/", 1)[1], original)
    assert config is not None and outcome["inputs"]["image"].startswith(f"{tag} (")
    first = {"config": config.json()["config"]["digest"], "gzip": original, "zstd": outcome["zstd"][0]}
    same = {key: first[key] == second[key] for key in ("config", "gzip", "zstd")}
    if not all(same.values()):
        lines = "\n".join(f"  {d}" for d in outcome["differences"])
        pytest.fail(f"a clean build and its rebuild ({second['builder']}) published different images {same}:\n{lines}")
    assert outcome["same"], outcome
    return {**second, "ref": outcome["original"], "arch": "x86_64", "engine_configs": [image_before, second["engine_config"]]}


def reproduced(docker_env: DockerEnv, tmp_path: Path, arch: str, base: str, *builder: str) -> dict[str, Any]:
    """A clean build published, then `ascendkit rebuild` of it; what the first published, once both agree."""
    run = uuid.uuid4().hex[:8]
    first = clean_build(docker_env, tmp_path / "first", f"{docker_env.registry}/repro-{run}-first", arch, base, *builder)
    docker_env.client.prune_builds(filters=cast(Any, {"type": ["exec.cachemount"]}), all=True)
    (tmp_path / "second").mkdir()
    checked = docker_env.ascendkit(
        "rebuild", first["ref"], "--to", f"{docker_env.registry}/repro-{run}-second", "--matrix", str(TEST_MATRIX), "--json", "--quiet",
        cwd=tmp_path / "second",
    )  # fmt: skip
    assert checked.returncode in (0, 1), f"rebuild could not run:\n{checked.stderr[-4000:]}"
    outcome = json.loads(checked.stdout)
    second = _published(outcome["build"], f"{docker_env.registry}/repro-{run}-second", tmp_path / "second")
    assert outcome["inputs"]["stack"] == "teststack" and outcome["inputs"]["source_date_epoch"] == 1735689600
    assert first["epoch"]["source_date_epoch"] == 1735689600, "the build record says it was built to reproduce, and against what"
    assert first["epoch"]["caveats"][0]["layer"] == "1. System packages", "and what may not reproduce"
    assert first["reproducible"] and first["reproducible"]["source_date_epoch"] == 1735689600, "the push record says how it differs"
    assert first["config"].startswith("sha256:"), "published normalized: its config recorded beside the engine's"
    same = {key: first[key] == second[key] for key in ("config", "gzip", "zstd")}
    assert outcome["same"] == same["gzip"] and outcome["zstd"] == [first["zstd"], second["zstd"]], outcome
    if not all(same.values()):
        refs = (f"{docker_env.registry}/repro-{run}-{which}@{result['gzip']}" for which, result in (("first", first), ("second", second)))
        shown = docker_env.ascendkit("diff", *refs, cwd=tmp_path)
        pytest.fail(
            f"two clean builds ({first['builder']}) published different images {same}:\n{shown.stdout[-6000:]}{shown.stderr[-2000:]}"
        )
    return {**first, "arch": arch, "engine_configs": [first["engine_config"], second["engine_config"]]}
