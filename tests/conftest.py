"""Shared fixtures: the shipped matrix, edited copies of it, and a CLI runner."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
from typer.testing import CliRunner

from buildkit.errors import Unavailable
from buildkit.image.engine import connect
from buildkit.image.render import context_paths
from buildkit.lock.inputs import lock_inputs, lock_targets
from buildkit.lock.lockfile import render_unresolved
from buildkit.matrix.load import LoadedMatrix, load_matrix
from tests.harness.forkrun import ForkServer, Run
from tests.harness.gitserver import serve
from tests.harness.openrlhf_standin import standin_repository
from tests.harness.services import ARM64_STATE_VAR

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "compat_matrix.yaml"
MATRIX_TEXT = MATRIX.read_text(encoding="utf-8")

EditMatrix = Callable[..., Path]

pytest_plugins = ("tests.harness.cpu_report",)  # under `make test`: the docker tests that used the most CPU

# The tests' own servers (registries, indexes, git hosts, fault proxies) listen on the loopback: never
# behind the proxy a CI machine or a corporate laptop sets for the outside world, which the unit tests
# must not need (`make unit-offline` points every proxy at a dead port to prove it).
LOOPBACK = ("127.0.0.1", "127.0.0.0/8", "localhost", "::1")  # urllib matches names, requests also CIDRs
for _name in ("NO_PROXY", "no_proxy"):
    _given = [h for h in os.environ.get(_name, "").split(",") if h.strip()]
    os.environ[_name] = ",".join([*_given, *(h for h in LOOPBACK if h not in _given)])


def default_verl(loaded: LoadedMatrix) -> str:
    """The default stack's verl pin: what tests about the default image read, never a literal, so
    moving the pin moves them with it."""
    stack = loaded.matrix.stacks[loaded.default_stack()]
    assert stack.framework == "verl", "the default stack is a verl stack"
    return stack.framework_version


def default_tag(loaded: LoadedMatrix, chip: str = "a3", os_name: str = "ubuntu22.04") -> str:
    """The full tag of the default stack's image for ``chip`` (as plan.full_tag writes it), spelled
    out from the matrix's pins so a test compares against the grammar, not against itself."""
    stack = loaded.matrix.stacks[loaded.default_stack()]
    cann = stack.cann.lower()
    return f"verl{default_verl(loaded)}-cann{cann}-torch_npu{stack.torch_npu.version}-{chip}-{os_name}-py{stack.python}"


def edit(text: str, old: str, new: str, count: int = 1) -> str:
    """Replace ``old`` (which must occur) the way a user editing the file would."""
    assert old in text, f"test setup: {old!r} not in the matrix"
    return text.replace(old, new, count)


@pytest.fixture(scope="session")
def loaded() -> LoadedMatrix:
    return load_matrix(MATRIX)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


RUN_MEMORY = 2 << 30  # the address space a forked run may take (RLIMIT_AS): a runaway fails, not the machine
RUN_TIMEOUT_S = 600.0  # wall seconds before a forked run counts as hung (CI shares two cores among every job)


@pytest.fixture(scope="session")
def forked() -> Iterator[ForkServer]:
    """This test process's fork server (tests/harness/forkrun.py): each `python -m buildkit` it runs is a
    process of its own, without importing ascendkit's libraries again (about 0.3 s of CPU a run saved)."""
    server = ForkServer.start()
    try:
        yield server
    finally:
        server.stop()


Ascendkit = Callable[..., Run]


@pytest.fixture
def ascendkit(forked: ForkServer, tmp_path_factory: pytest.TempPathFactory) -> Ascendkit:
    """``ascendkit(*args, cwd=ROOT, env=None)``: `python -m buildkit ARGS` forked from the session's server,
    in this process's environment updated by ``env``; its exit status and streams."""

    def run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> Run:
        streams = tmp_path_factory.mktemp("streams")
        return forked.run(args, cwd=cwd, env={**os.environ, **(env or {})}, out_dir=streams, memory=RUN_MEMORY, timeout=RUN_TIMEOUT_S)

    return run


@pytest.fixture
def matrix_copy(tmp_path: Path) -> EditMatrix:
    """Write the shipped matrix with edits applied (pairs of old, new) into tmp_path."""

    def make(*edits: tuple[str, str], text: str | None = None) -> Path:
        body = MATRIX_TEXT if text is None else text
        for old, new in edits:
            body = edit(body, old, new)
        path = tmp_path / "compat_matrix.yaml"
        path.write_text(body, encoding="utf-8")
        return path

    return make


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A copy of the files `render --all/--check` reads and writes."""
    dest = tmp_path / "repo"
    dest.mkdir()
    (dest / "docs").mkdir()
    generated = (
        "docs/matrix.md", "docs/cli.md", "docs/hardware.md", "Dockerfile.a2", "Dockerfile.a3", "compat_matrix.schema.json",
        "build_manifest.schema.json",
    )  # fmt: skip
    for name in ("compat_matrix.yaml", "docs/verl-parity.md", *generated):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "upstream", dest / "upstream")  # the vendored files the parity page reads
    shutil.copytree(ROOT / "docs" / "repositories", dest / "docs" / "repositories")
    shutil.copytree(ROOT / "dockerfiles", dest / "dockerfiles")
    shutil.copytree(ROOT / "locks", dest / "locks")
    shutil.copytree(ROOT / ".github", dest / ".github")
    shutil.copytree(ROOT / "ci", dest / "ci")  # the GitLab pipeline render --all writes
    return dest


def published_config(built: dict[str, Any]) -> str:
    """The config digest a built image is published with: its build record's (publishing clamps its times,
    buildkit/ship/layers/normalize.py), or the engine's where it publishes the image as the engine has it."""
    record = json.loads((Path(built["workdir"]) / built["manifest"]).read_text(encoding="utf-8"))  # relative to the build's directory
    return str((record.get("published") or {}).get("config") or built["image_id"])


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    """1-based line number of the n-th line containing ``needle``."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    return hits[occurrence - 1]


# ---- integration: the real Docker engine, registry and stand-in base ---------------------------

# The docker tests `make test` runs on a second engine of the same kind (tests/harness/ci.py's docker-b job)
# while the rest run on the first: those that share no image with the others (they build their own,
# or none), and the fault tests, which wait on their proxies most of the time (the test image they
# publish is built there once more: a minute, against the five they spend waiting).
SECOND_ENGINE = {
    "test_api.py", "test_reproducible.py", "test_credentials_docker.py", "test_engines.py", "test_engine_stall.py", "test_faults.py",
    "test_frontier_images.py", "test_gitlab_local.py", "test_offline_build.py", "test_openrlhf_image.py", "test_ray_cluster.py",
    "test_resume.py",
    # these two use the session's `built` image, which docker-b builds for its own tests too: the docker job ended
    # last, 2.6 min after docker-b, the last minutes alone with one core idle (CI50, fresh), and 1.6 min after once
    # test_lazy_pull moved (CI51)
    "test_lazy_pull.py", "test_mirror.py",
}  # fmt: skip


# The unit modules whose tests take seconds each, and why (measured: together 80 % of the unit suite's
# time). `make check`, the inner loop, leaves them to `make unit` and CI, which run every one.
SLOW = {
    "test_bad_inputs.py": "every bad input through the installed command, a process each",
    "test_k8s.py": "every kind, SKU and scheduler against Kubernetes' schemas and the CRDs",
    "test_openrlhf_contract.py": "OpenRLHF's own parser, with Ray imported",
    "test_verl_contract.py": "verl's Hydra config composed per job",
    "test_scan.py": "checkov",
    "test_gitlab.py": "GitLab's schema and each command line parsed",
    "test_workflow.py": "actionlint, zizmor and each command line parsed",
    "test_smoke.py": "smoke jobs run against stand-in frameworks and Ray",
    "test_packaging.py": "the wheel built and installed",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SECOND_ENGINE and item.get_closest_marker("docker") is not None:
            item.add_marker(pytest.mark.second_engine)
        if item.path.name in SLOW:
            item.add_marker(pytest.mark.slow)


TEST_MATRIX = ROOT / "tests" / "fixtures" / "test_matrix.yaml"


def write_unresolved_locks(matrix: Path, reason: str = "test: the pins were changed on purpose") -> None:
    """Locks marked unresolved, current for ``matrix``: its builds take the unhashed fallback path
    (what a target whose index cannot be reached gets), for tests that change pins on purpose."""
    loaded = load_matrix(matrix)
    for target in lock_targets(loaded):
        path = loaded.root / target.path
        path.parent.mkdir(exist_ok=True)
        path.write_text(render_unresolved(lock_inputs(loaded, target), reason), encoding="utf-8")


@dataclass(frozen=True)
class DockerEnv:
    client: docker.APIClient
    standin: str
    registry: str  # HOST:PORT
    env: dict[str, str]
    registry2: str = ""  # HOST:PORT of the second registry (another registry, not another repository)
    containerd: str = ""  # the engine's containerd socket, for `ctr`

    def ascendkit(self, *args: str, cwd: Path, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run the installed console script exactly as a user would."""
        exe = Path(sys.executable).with_name("ascendkit")
        proc = subprocess.run([str(exe), *args], cwd=cwd, env=self.env, capture_output=True, text=True, check=False)
        if check and proc.returncode != 0:
            pytest.fail(f"ascendkit {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        return proc

    def containers(self) -> set[str]:
        return {c["Id"] for c in self.client.containers(all=True)}


@contextlib.contextmanager
def set_aside(client: docker.APIClient, refs: list[str], where: Path) -> Iterator[None]:
    """The local images ``refs`` name removed for the block (every tag of each), and afterwards the
    very images loaded back with their tags, whatever the block pulled in their place: on the
    containerd store an image pulled again is another local image (another ID, and no content for
    the layers it found unpacked), which later tests could not publish."""
    archives = [where / f"set-aside-{i}.tar" for i in range(len(refs))]
    for ref, archive in zip(refs, archives, strict=True):
        with archive.open("wb") as out:
            for chunk in client.get_image(ref):
                out.write(chunk)
    tags = {ref: list(client.inspect_image(ref).get("RepoTags") or []) for ref in refs}
    for image in {client.inspect_image(ref)["Id"] for ref in refs}:
        client.remove_image(image, force=True, noprune=True)
    try:
        yield
    finally:
        for tag in {t for each in tags.values() for t in each}:
            with contextlib.suppress(docker.errors.NotFound):
                client.remove_image(tag, force=True)
        for ref, archive in zip(refs, archives, strict=True):
            with archive.open("rb") as data:
                list(client.load_image(data))
            archive.unlink()
            for tag in tags[ref]:  # an archive saved by one name carries that one
                name, _, version = tag.rpartition(":")
                client.tag(ref, name, version, force=True)


def arm64_standin() -> str:
    """The arm64 stand-in base `make test` makes with ASCENDKIT_ARM64=1 (qemu). Where it was asked
    for (ASCENDKIT_ARM64=1, as .ci/run sets, or CI) a missing one fails the test; elsewhere the test
    is skipped with the reason."""
    standin = os.environ.get("ASCENDKIT_STANDIN_IMAGE_ARM64")
    if not standin:
        if os.environ.get("ASCENDKIT_ARM64") == "1" or os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail("no arm64 stand-in although ASCENDKIT_ARM64=1 (or CI) asked for one: `make test` should have made it")
        pytest.skip("no arm64 stand-in: `make test` makes one when ASCENDKIT_ARM64=1 (qemu emulation)")
    state = os.environ.get(ARM64_STATE_VAR)  # CI makes it in a job of its own, beside the amd64 tests
    if state:
        deadline = time.monotonic() + ARM64_STANDIN_WAIT_S
        while not Path(state).exists() and time.monotonic() < deadline:
            time.sleep(2)
        said = Path(state).read_text().strip() if Path(state).exists() else f"not there after {ARM64_STANDIN_WAIT_S} s"
        if said != "ready":
            pytest.fail(f"the arm64 stand-in {standin}: {said} (the `arm64-standin` job's log says more)")
    return standin


# A hang guard: its debootstrap under qemu took 16 min beside `make test`'s other jobs on a fresh machine (CI21).
ARM64_STANDIN_WAIT_S = 2700


@pytest.fixture(scope="session")
def docker_env(tmp_path_factory: pytest.TempPathFactory) -> DockerEnv:
    """The engine, registry and stand-in that `make test` starts. In CI a missing engine fails the
    tests instead of skipping them; elsewhere they are skipped with the reason."""
    required = os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get("ASCENDKIT_REQUIRE_DOCKER") == "1"
    standin, registry = os.environ.get("ASCENDKIT_STANDIN_IMAGE"), os.environ.get("ASCENDKIT_REGISTRY")
    problem = None
    if not (standin and registry):
        problem = "ASCENDKIT_STANDIN_IMAGE / ASCENDKIT_REGISTRY are not set: `make test` starts the engine, registry and stand-in base"
    else:
        try:
            client = connect()
        except Unavailable as exc:
            problem = str(exc)
    if problem:
        if required:
            pytest.fail(f"integration tests need the Docker engine: {problem}")
        pytest.skip(problem)
    assert standin and registry
    # The layers the commands compress are remembered for this session only: what a test sends does
    # not depend on what earlier runs on this machine left in ~/.cache/ascendkit.
    env = {**os.environ, "ASCENDKIT_CACHE": str(tmp_path_factory.mktemp("ascendkit-cache"))}
    registry2 = os.environ.get("ASCENDKIT_REGISTRY2", "")
    if required and not registry2:
        pytest.fail("ASCENDKIT_REGISTRY2 is not set: `make test` starts a second registry")
    if required and not os.environ.get("ASCENDKIT_BUILDX"):  # without it `build` would quietly fall back to the classic builder
        pytest.fail("ASCENDKIT_BUILDX is not set: `make test` unpacks the docker-buildx that builds run BuildKit through")
    return DockerEnv(client, standin, registry, env, registry2, os.environ.get("ASCENDKIT_CONTAINERD", ""))


@pytest.fixture(scope="session")
def built(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The test stack built for a3/x86_64 and pushed to the local registry, as `ascendkit build` does it."""
    return build_and_push(docker_env, tmp_path_factory.mktemp("build"), f"it-{uuid.uuid4().hex[:8]}", "--hw", "a3")


@pytest.fixture(scope="session")
def built_arm64(docker_env: DockerEnv, built: dict[str, Any]) -> dict[str, Any]:
    """The test stack built for a3/aarch64 on the arm64 stand-in (its steps under qemu) and pushed beside ``built``,
    which completes that repository's multi-arch index."""
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "aarch64", "--matrix", str(TEST_MATRIX), "--base-image", arm64_standin(),
        "--push", "--registry", f"{docker_env.registry}/{built['repo']}", "--json", "-q",
        cwd=built["workdir"], check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def build_and_push(docker_env: DockerEnv, workdir: Path, repo: str, *args: str) -> dict[str, Any]:
    """`ascendkit build` of the test matrix for x86_64 on the stand-in base, pushed to ``repo`` of the
    local registry (the registry outlives test runs: each run gives its own repository); its JSON
    result with the workdir, the repository and the build's stderr."""
    proc = docker_env.ascendkit(
        "build", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin,
        "--push", "--registry", f"{docker_env.registry}/{repo}", "--json", "--quiet", *args,
        cwd=workdir, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(proc.stdout)
    result.update(workdir=workdir, repo=repo, stderr=proc.stderr)
    return result


def own_repo(name: str) -> str:
    """``<name>-<random>/verl``: a repository no other run used. The engines keep what earlier runs left
    (CI's machine is not wiped between runs), so a test that says a name holds no image gives it its own."""
    return f"{name}-{uuid.uuid4().hex[:6]}/verl"


def certificate(directory: Path, name: str) -> Path:
    """A self-signed certificate nobody else has (its key beside it), valid for a day: a CA of our own."""
    key, cert = directory / "k.pem", directory / "c.pem"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}"]
    subprocess.run([*openssl, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert


SECRET_TOKEN = "s3cr3t-ascendkit-token-4f9c2"


@dataclass(frozen=True)
class SecretBuild:
    """A clean build of the test stack given secrets: a CA bundle with one certificate nobody else has
    (``unique``: a base64 line of it) and a credential in both index URLs."""

    result: dict[str, Any]
    output: str  # the build's stdout and stderr
    unique: bytes
    workdir: Path


@pytest.fixture(scope="session")
def secret_builds(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], SecretBuild]:
    """``secret_builds(builder)``: the test stack built from clean (``--no-cache``) with secrets by
    ``builder``, once per session: the secrets test scans it, and the classic one is also what the
    two builders' comparison holds against BuildKit's build (both on Docker 20.10 alone: on the containerd
    store each classic step is a commit of its own, and a classic build costs a minute or two of CPU there)."""
    done: dict[str, SecretBuild] = {}

    def build(builder: str) -> SecretBuild:
        if builder not in done:
            workdir = tmp_path_factory.mktemp(f"secrets-{builder}")
            cert = certificate(workdir, "ascendkit-test-ca")
            host_bundle = Path(docker_env.env.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"))
            bundle = workdir / "bundle.pem"
            bundle.write_bytes(host_bundle.read_bytes() + cert.read_bytes())
            index = f"https://ascendkit-bot:{SECRET_TOKEN}@pypi.org/simple"
            proc = docker_env.ascendkit(
                "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin,
                "--ca-bundle", str(bundle), "--pip-index-url", index,
                "--pytorch-index-url", index,  # x86_64 torch's index, also credentialed
                "--no-cache", "--repo", f"secrets-{builder}-{uuid.uuid4().hex[:6]}/verl", "--builder", builder, "--json", "-q",
                cwd=workdir, check=True,
            )  # fmt: skip
            unique = cert.read_text().splitlines()[5].encode()  # a base64 line from the middle of the cert
            done[builder] = SecretBuild(json.loads(proc.stdout), proc.stdout + proc.stderr, unique, workdir)
        return done[builder]

    return build


# ---- the OpenRLHF-shaped test image (tests/test_openrlhf_image.py, tests/test_ray_cluster.py) --------------------

OPENRLHF_STANDIN_COMMIT = "12e2a08edffda11502c61db53dfa9cc7b647b14f"  # tests/fixtures/test_matrix.yaml pins it


@pytest.fixture(scope="session")
def standin_git(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The stand-in OpenRLHF repository on a git host the build's containers reach (the bridge gateway)."""
    root = tmp_path_factory.mktemp("git")
    assert standin_repository(root) == OPENRLHF_STANDIN_COMMIT, "tests/fixtures/test_matrix.yaml pins the stand-in's commit"
    with serve(root, host=bridge_gateway(docker_env)) as url:
        yield url


def bridge_gateway(docker_env: DockerEnv) -> str:
    """The engine's bridge gateway: an address of this host every container on the default bridge
    (every build step) can route to, where the tests serve what a user's mirror would."""
    network = docker_env.client.inspect_network("bridge")
    gateway: str | None = network["IPAM"]["Config"][0].get("Gateway")
    if not gateway:  # the default bridge does not always say: its interface on this host holds the address
        interface = network["Options"]["com.docker.network.bridge.name"]
        shown = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", interface], capture_output=True, text=True, check=True)
        gateway = shown.stdout.split(" inet ", 1)[1].split("/", 1)[0]
    return gateway


@pytest.fixture(scope="session")
def openrlhf_built(  # the OpenRLHF-shaped test image (with the real Ray), built and pushed once per session
    docker_env: DockerEnv, standin_git: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    workdir, repo = tmp_path_factory.mktemp("openrlhf-build"), f"it-openrlhf-{uuid.uuid4().hex[:8]}"
    return build_and_push(docker_env, workdir, repo, "--hw", "a2", "--stack", "teststack-openrlhf", "--github-url", standin_git)


# ---- `pip install .` of the checkout (tests/test_packaging.py, tests/test_ship.py) ---------------------------


@pytest.fixture(scope="session")
def ascendkit_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built as a release is, alone in its directory (a find-links directory for pip)."""
    wheels = tmp_path_factory.mktemp("wheel")
    # from a copy of the sources, as a release build would: setuptools' in-tree build/ folder keeps
    # modules a checkout has since deleted, and would put them in the wheel
    source = tmp_path_factory.mktemp("src") / "ascendkit"
    ignored = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "smoke-out", "manifests")
    shutil.copytree(ROOT, source, ignore=ignored)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(source)], check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("ascendkit_verl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {p.relative_to(ROOT).as_posix() for d in ("crds", "files") for p in (ROOT / "buildkit" / "k8s" / d).iterdir()}
    for expected in ["buildkit/templates/Dockerfile.j2", "buildkit/smoke_tests/grpo_smoke.yaml", *data]:
        assert expected in names, expected
    assert set(context_paths()) <= names, "everything the Dockerfile COPYs from the build context"
    released = zipfile.ZipFile(wheel).read("buildkit/compat_matrix.yaml")
    assert released == MATRIX.read_bytes(), "the wheel carries the matrix it was built from, byte for byte"
    # every module of the checkout: a subpackage left out of pyproject's list would still import
    # below through the editable install's finder, so the wheel's contents are compared directly
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "buildkit").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    smoke = {"buildkit/smoke_tests/" + p.relative_to(ROOT / "smoke_tests").as_posix() for p in (ROOT / "smoke_tests").rglob("*.py")}
    assert smoke <= names, f"every smoke_tests program ships (smoke --cpu runs them): {sorted(smoke - names)}"
    return wheel


@pytest.fixture(scope="session")
def installed(ascendkit_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    argv = [*pip, "install", "--no-deps", "--target", str(target), str(ascendkit_wheel)]
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    return target


def run_installed(installed: Path, cwd: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m buildkit ARGV` from the installed wheel (ahead of the editable checkout on the path)."""
    env = {**(env or os.environ), "PYTHONPATH": str(installed)}
    return subprocess.run([sys.executable, "-m", "buildkit", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
