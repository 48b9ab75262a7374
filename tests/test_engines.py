"""The engines users run (docs/engines.md), side by side: Docker 26.1.5 with the containerd image
store (every docker test's engine), Docker 20.10, Docker 26.1.5 on overlay2, and Podman through its
Docker-compatible API. One image loaded into each and published from each gives one manifest
digest; an image the containerd store holds zstd-compressed (pulled back from our own -zstd tag)
republishes to the same digests; each engine says what it is."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from buildkit.image.archive import identify
from buildkit.image.engine import CONTAINERD_STORE, GRAPH_DRIVER_STORE, PODMAN_STORE, engine_facts
from buildkit.imageref import RegistryRef
from buildkit.ship.layers.compressors import GZIP_MAGIC, ZSTD_MAGIC
from buildkit.ship.layers.local import LocalImage
from buildkit.ship.options import Target, ship_options
from buildkit.ship.publish import push_image
from tests.conftest import DockerEnv
from tests.harness import skopeo

pytestmark = pytest.mark.docker
REQUIRED = os.environ.get("ASCENDKIT_REQUIRE_DOCKER") == "1" or os.environ.get("CI", "").lower() in ("1", "true")


def _need(what: str) -> None:
    if REQUIRED:
        pytest.fail(f"{what}: `make test` provides it")
    pytest.skip(f"{what} (`make services` provides it)")


def engines() -> dict[str, docker.APIClient]:
    """Every engine `make services` started, by name (ASCENDKIT_ENGINE_HOSTS)."""
    pairs = [p.split("=", 1) for p in os.environ.get("ASCENDKIT_ENGINE_HOSTS", "").split(",") if "=" in p]
    if len(pairs) < 3:
        _need("ASCENDKIT_ENGINE_HOSTS does not name the three Docker engines")
    return {name: docker.APIClient(base_url=host, version="auto", timeout=600) for name, host in pairs}


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[docker.APIClient]:
    """Podman's Docker-compatible API (`podman system service`) on a socket, root and run root of the test's own."""
    exe = shutil.which("podman")
    if exe is None:
        _need("podman is not installed")
    assert exe is not None
    where = tmp_path_factory.mktemp("podman")
    socket = where / "podman.sock"
    argv = [exe, "--root", str(where / "root"), "--runroot", str(where / "run"), "system", "service", "--time=0", f"unix://{socket}"]
    with (where / "service.log").open("wb") as log:
        service = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(Exception):
                client = docker.APIClient(base_url=f"unix://{socket}", version="auto", timeout=600)
                if client.ping():
                    break
            if time.monotonic() > deadline or service.poll() is not None:
                pytest.fail(f"podman system service did not answer:\n{(where / 'service.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield client
    finally:
        service.terminate()
        service.wait(timeout=30)
        subprocess.run(["umount", "-R", str(where / "root" / "overlay")], capture_output=True, check=False)


def test_each_engine_says_what_it_is(docker_env: DockerEnv, podman: docker.APIClient) -> None:
    found = {name: engine_facts(client) for name, client in engines().items()}
    main = engine_facts(docker_env.client)
    assert (main.product, main.image_store, main.version.split("+")[0]) == ("Docker Engine", CONTAINERD_STORE, "26.1.5"), main
    assert found["docker-20.10"].version.startswith("20.10.") and found["docker-20.10"].api_version == "1.41"
    assert (found["docker-20.10"].image_store, found["docker-20.10"].storage_driver) == (GRAPH_DRIVER_STORE, "overlay2")
    assert (found["docker-overlay2"].image_store, found["docker-overlay2"].version.split("+")[0]) == (GRAPH_DRIVER_STORE, "26.1.5")
    said = engine_facts(podman)
    assert (said.product, said.image_store) == ("Podman", PODMAN_STORE) and said.api_version.startswith("1.4"), said
    assert str(main).startswith("Docker Engine 26.1.5") and "containerd image store" in str(main)


def _small_image(client: docker.APIClient, tag: str) -> None:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (
            ("Dockerfile", b"FROM scratch\nCOPY noise /noise\nCOPY text /etc/text\nLABEL io.ascendkit.test=engines\n"),
            ("noise", uuid.uuid4().bytes * 150_000),  # 2.4 MB, new each run: nothing cached anywhere
            ("text", b"an Ascend NPU image layer\n" * 100_000),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    for event in client.build(fileobj=context, custom_context=True, decode=True, rm=True, tag=tag):
        assert "error" not in event, event


def _loaded(said: Iterator[dict[str, str]], tag: str) -> str:
    """The name ``docker load`` gave ``tag``: as is, or Podman's (docker.io/... from an OCI layout, localhost/... from a legacy one)."""
    names = [
        n.strip() for line in said for n in line.get("stream", "").partition(":")[2].split(",") if "Loaded image" in line.get("stream", "")
    ]
    matching = [n for n in names if n.endswith(tag)]
    assert matching, f"the engine loaded {names}, not {tag}"
    return matching[0]


def _publish(client: docker.APIClient, ref: str, destination: str, cache: Path) -> dict[str, str]:
    """``ref`` of ``client`` published to ``destination`` (gzip and zstd) with a cache of its own:
    every layer exported from this engine and compressed here. Its manifest digest per compression."""
    identity = identify(client, ref)
    image = LocalImage(identity.config, "x86_64", ("x86_64",), ("engines-x86_64",), None, identity.engine_id)
    os.environ["ASCENDKIT_CACHE"] = str(cache)
    try:
        outcome = push_image(client, image, [Target.of(RegistryRef.parse(destination))], ship_options(None, "zstd"))
    finally:
        del os.environ["ASCENDKIT_CACHE"]
    return {p.compression: p.digest for p in next(iter(outcome.registries.values()))}


@pytest.fixture(scope="module")
def published_everywhere(
    docker_env: DockerEnv, podman: docker.APIClient, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, str]]:
    """One small image built on the containerd store, saved, loaded into every other engine and
    Podman, and published from each to a repository of its own: each engine's digests."""
    where = tmp_path_factory.mktemp("engines")
    run = uuid.uuid4().hex[:8]
    tag = f"ascendkit-test/engines:{run}"
    _small_image(docker_env.client, tag)
    archive = where / "image.tar"
    with archive.open("wb") as out:
        for chunk in docker_env.client.get_image(tag):
            out.write(chunk)
    clients = {"containerd-store": docker_env.client, **{n: c for n, c in engines().items() if n != "docker"}, "podman": podman}
    digests, refs = {}, {}
    try:
        for name, client in clients.items():
            ref = tag
            if client is not docker_env.client:
                # Podman 4.3 cannot save again what it loaded from an OCI layout of gzip blobs ("Unknown
                # media type during manifest conversion", docs/engines.md): it loads 20.10's legacy archive.
                source = where / "legacy.tar" if name == "podman" else archive
                with source.open("rb") as data:
                    ref = _loaded(client.load_image(data), tag)
                if name == "docker-20.10":
                    with (where / "legacy.tar").open("wb") as out:
                        for chunk in client.get_image(ref):
                            out.write(chunk)
            refs[name] = ref
            destination = f"{docker_env.registry}/it-engines-{run}-{name}"
            digests[name] = _publish(client, ref, destination, where / f"cache-{name}")
    finally:
        for name, client in clients.items():
            with contextlib.suppress(docker.errors.DockerException):
                client.remove_image(refs.get(name, tag), force=True)
    digests["run"] = {"tag": run}
    return digests


def test_one_image_published_from_every_store_has_one_digest(
    published_everywhere: dict[str, dict[str, str]], docker_env: DockerEnv
) -> None:
    """The layouts differ (the containerd store's blobs gzip-compressed and named by their digest,
    20.10's legacy archive, 25+'s OCI layout of DiffIDs, Podman's docker-archive); the published
    image does not: the same gzip and zstd manifest digests, whichever engine it came from."""
    engines_seen = {k: v for k, v in published_everywhere.items() if k != "run"}
    assert set(engines_seen) == {"containerd-store", "docker-20.10", "docker-overlay2", "podman"}
    assert len({json.dumps(d, sort_keys=True) for d in engines_seen.values()}) == 1, engines_seen
    run = published_everywhere["run"]["tag"]
    for name in engines_seen:  # read back by a client nobody here wrote
        for compression, digest in engines_seen[name].items():
            repository = f"{docker_env.registry}/it-engines-{run}-{name}"
            assert skopeo.digest(f"{repository}:{'engines-x86_64' if compression == 'gzip' else 'engines-x86_64-zstd'}") == digest


def test_an_image_the_containerd_store_holds_zstd_republishes_unchanged(docker_env: DockerEnv, tmp_path: Path) -> None:
    """Published with zstd from another engine and pulled by its -zstd tag, an image sits in the
    containerd store as zstd blobs (its `docker save` says so); published from there it gives the
    digests it was published with."""
    other = engines()["docker-overlay2"]
    run = uuid.uuid4().hex[:8]
    tag = f"ascendkit-test/engines-zstd:{run}"
    _small_image(other, tag)
    repository = f"{docker_env.registry}/it-engines-zstd-{run}"
    try:
        first = _publish(other, tag, repository, tmp_path / "cache-first")
    finally:
        other.remove_image(tag, force=True)
    ref = f"{repository}:engines-x86_64-zstd"
    docker_env.client.pull(ref)
    try:
        formats = set()
        with tarfile.open(fileobj=io.BytesIO(b"".join(docker_env.client.get_image(ref)))) as tar:
            for member in tar:
                source = tar.extractfile(member) if member.isfile() and member.name.startswith("blobs/") else None
                head = source.read(4) if source is not None else b"{"
                if not head.startswith(b"{"):  # a layer, not a config, manifest or index
                    formats.add("zstd" if head.startswith(ZSTD_MAGIC) else "gzip" if head.startswith(GZIP_MAGIC) else "plain")
        assert formats == {"zstd"}, f"the containerd store keeps what it pulled: {formats}"
        again = _publish(docker_env.client, ref, f"{repository}-again", tmp_path / "cache-again")
        assert again == first
    finally:
        docker_env.client.remove_image(ref, force=True)


def test_the_containerd_store_names_images_by_manifest_and_we_by_config(docker_env: DockerEnv) -> None:
    """What the issue turned on, kept true: the store's image ID is not the config digest, its
    RepoDigests name a local manifest of an image never pushed; identify finds the config anyway."""
    inspect = docker_env.client.inspect_image(docker_env.standin)
    identity = identify(docker_env.client, docker_env.standin)
    assert identity.engine_id == inspect["Id"] != identity.config
    legacy = engines()["docker-20.10"]
    assert legacy.inspect_image(docker_env.standin)["Id"] == identity.config, "20.10 names the same stand-in by its config"
    assert [d.partition("@")[2] for d in inspect.get("RepoDigests") or []] == [inspect["Id"]]


def test_doctor_on_the_host_says_which_engine_it_reaches(docker_env: DockerEnv, tmp_path: Path) -> None:
    """`ascendkit doctor` on a host names the engine its docker CLI reaches (Docker 26.1.5's own CLI
    here), with its API version and image store, and warns of one past its end of life (20.10)."""
    cli = os.environ.get("ASCENDKIT_DOCKER_CLI", "")
    if not cli:
        _need("ASCENDKIT_DOCKER_CLI does not name Docker's CLI")
    hosts = dict(p.split("=", 1) for p in os.environ.get("ASCENDKIT_ENGINE_HOSTS", "").split(",") if "=" in p)
    hosts["this job's"] = docker_env.env["DOCKER_HOST"]
    for name, host in hosts.items():
        env = {**docker_env.env, "PATH": f"{Path(cli).parent}:{os.environ.get('PATH', '')}", "DOCKER_HOST": host}
        exe = str(Path(sys.executable).with_name("ascendkit"))
        proc = subprocess.run([exe, "doctor", "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, check=False)
        report = json.loads(proc.stdout)
        facts = engine_facts(docker.APIClient(base_url=host, version="auto"))
        assert report["engine"] == facts.describe(), (name, report["engine"])
        (check,) = [c for c in report["checks"] if c["name"] == "engine"]
        assert check["status"] == ("warn" if facts.version.startswith("20.10") else "ok"), (name, check)
