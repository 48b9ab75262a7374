"""`ascendkit build` against the real Docker engine, with the test stack on the stand-in base."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from buildkit.errors import ExitCode
from buildkit.fsio import read_cache
from buildkit.image.archive import identify
from buildkit.image.engine import engine_facts
from buildkit.image.probe import run_in_image
from buildkit.image.verify import Expected, collect_facts, extension_checks
from buildkit.lock.inputs import lock_inputs, lock_targets
from buildkit.lock.lockfile import read_lock, render_unresolved
from buildkit.matrix.load import load_matrix
from buildkit.plan import UV_LAYER
from tests.conftest import SECRET_TOKEN, TEST_MATRIX, DockerEnv, SecretBuild, certificate, own_repo, write_unresolved_locks
from tests.harness.imagescan import scan_saved_image

pytestmark = pytest.mark.docker


def _labels(env: DockerEnv, ref: str) -> dict[str, str]:
    return dict(env.client.inspect_image(ref)["Config"]["Labels"])


@pytest.mark.engine_20_10
@pytest.mark.engine_overlay2
def test_labels_and_manifest_match_the_matrix(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    stack = load_matrix(TEST_MATRIX).matrix.stacks["teststack"]
    labels = _labels(docker_env, built["tags"][0])
    for component, pin in stack.pins().items():
        assert labels[f"io.ascendkit.version.{component.replace('_', '-')}"] == pin.version
    assert labels["io.ascendkit.stack"] == "teststack"
    assert labels["io.ascendkit.standin"] == "true"  # inherited: an image on the stand-in says so
    assert labels["org.opencontainers.image.base.name"] == docker_env.standin

    manifest = json.loads((built["workdir"] / built["manifest"]).read_text())
    assert manifest["passed"] is True
    assert manifest["image"]["id"] == built["image_id"]
    # the image is its config digest on every engine; the engine's own name for it beside it where they differ
    engine = engine_facts(docker_env.client)
    assert manifest["engine"] == engine.describe()
    assert identify(docker_env.client, built["engine_id"]).config == built["image_id"]
    if engine.image_store == "containerd":
        # BuildKit's metadata named the config, remembered so that nothing reads the image back out of the
        # engine: the manifest the engine holds under that ID, read from its containerd, names the same
        assert docker_env.containerd, "ASCENDKIT_CONTAINERD: `make test` names the engine's containerd"
        ctr = ["ctr", "--address", docker_env.containerd, "--namespace", "moby"]
        held = subprocess.run([*ctr, "content", "get", built["engine_id"]], capture_output=True, check=True).stdout
        assert json.loads(held)["config"]["digest"] == built["image_id"]
        assert read_cache(Path(docker_env.env["ASCENDKIT_CACHE"]) / "image-configs.json")[built["engine_id"]] == built["image_id"]
    assert manifest["image"].get("engine_id", built["image_id"]) == built["engine_id"]
    assert (built["engine_id"] != built["image_id"]) == (engine.image_store == "containerd")
    # the stand-in was loaded, never pulled: recorded so on every engine, by its config digest
    base = manifest["build"]["base_image"]
    standin_layers = len(docker_env.client.inspect_image(docker_env.standin)["RootFS"]["Layers"])  # kept as they are when published
    assert base == {
        "ref": docker_env.standin,
        "digest": identify(docker_env.client, docker_env.standin).config,
        "from_registry": False,
        "layers": standin_layers,
    }
    assert {c["status"] for c in manifest["checks"]} == {"ok"}
    installed = {p["name"]: p["version"] for p in manifest["packages"]}
    for pin in stack.pins().values():
        assert installed[pin.package or ""] == pin.version
    assert manifest["cann"] == {
        "version": "8.3.RC1",
        "source": "/usr/local/Ascend/ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info",
    }
    md = (built["workdir"] / built["manifest_md"]).read_text()
    assert "Verification: **passed**" in md and "| package idna | 3.7 | 3.7 | ok |" in md


def test_compiled_extensions_are_checked_and_a_build_without_them_fails_naming_the_component(
    docker_env: DockerEnv, built: dict[str, Any]
) -> None:
    """The vllm stand-in (MarkupSafe from its sdist) compiles its C speedups, as vllm-ascend its custom
    ops: verification finds the shared object and resolves its libraries in the image. Judged as if the
    vllm-ascend stand-in (iniconfig, also built from its sdist, pure Python) had to produce kernels, the
    same image fails, naming the component: a source build that "succeeded" without them."""
    manifest = json.loads((built["workdir"] / built["manifest"]).read_text())
    (ext,) = [c for c in manifest["checks"] if c["name"].startswith("extension")]
    assert ext["name"] == "extension vllm" and ext["status"] == "ok", ext
    assert "/markupsafe/_speedups.cpython-311-x86_64-linux-gnu.so: " in ext["actual"] and "libraries resolve" in ext["actual"]
    facts = collect_facts(docker_env.client, built["tags"][0], (), ("markupsafe._speedups", "iniconfig._kernels"))
    claimed = Expected("teststack", "a3", ("a3",), "debian12", "x86_64", "3.11", "8.3.RC1", "b", (), (),
                       extensions=(("vllm", "markupsafe._speedups"), ("vllm_ascend", "iniconfig._kernels")))  # fmt: skip
    checks = {c.name: c for c in extension_checks(facts, claimed)}
    assert checks["extension vllm"].status == "ok"
    missing = checks["extension vllm_ascend"]
    assert missing.status == "error" and "no _kernels.*.so in" in missing.actual and "its kernels were not compiled" in missing.actual


@pytest.mark.engine_20_10
def test_json_result_and_tags(built: dict[str, Any]) -> None:
    assert built["image_id"].startswith("sha256:")
    assert built["tags"] == [
        "ascendkit/verl:verl3.7-cann8.3.rc1-torch_npu2.0.0-a3-debian12-py3.11-x86_64",
        "ascendkit/verl:teststack-a3-debian12-x86_64",
        "ascendkit/verl:teststack-a3-x86_64",
        "ascendkit/verl:latest-a3-x86_64",
    ]
    assert built["steps_total"] >= 15 and 0 <= built["steps_cached"] <= built["steps_total"]
    assert built["duration_s"] > 0
    assert len({p["digest"] for p in built["pushed"]}) == 1  # every tag points at one pushed manifest
    assert built["index"] is None and built["index_missing"] == ["aarch64"]
    assert built["digest"] == built["pushed"][0]["digest"]
    assert "[10/" in built["stderr"] and "steps cached), verified; manifest" in built["stderr"]


def test_rebuild_without_change_is_fully_cached(docker_env: DockerEnv, built: dict[str, Any]) -> None:
    """Two builds in a row give one image, every step of the second cached. Compared with each other,
    not with the session's first build: a --no-cache build elsewhere in the suite (offline, secrets)
    leaves newer cache records, whatever order the tests run in."""
    argv = ["build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin, "--json", "-q"]
    first = json.loads(docker_env.ascendkit(*argv, cwd=built["workdir"], check=True).stdout)
    again = json.loads(docker_env.ascendkit(*argv, cwd=built["workdir"], check=True).stdout)
    assert again["image_id"] == first["image_id"]
    assert again["steps_cached"] == again["steps_total"] == built["steps_total"]


@pytest.mark.engine_20_10
def test_an_unchanged_verified_image_is_not_verified_again(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    """The same image ID with a passed verification against the same expectations on record: its
    result is reused and the tags set; --reverify, or a manifest for other expectations, verifies."""
    argv = ["build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin, "--json", "-q"]
    first = json.loads(docker_env.ascendkit(*argv, cwd=tmp_path, check=True).stdout)  # this directory's manifest: written now
    (manifest,) = (p for p in (tmp_path / "manifests").glob("verl3.7-*.json") if not p.name.endswith(".cdx.json"))  # not the SBOM
    written = manifest.stat().st_mtime_ns
    reused = docker_env.ascendkit(*argv, cwd=tmp_path, check=True)
    result = json.loads(reused.stdout)
    assert result["verification"] == "reused" and result["image_id"] == first["image_id"], reused.stderr
    assert "unchanged; its passed verification is reused (--reverify runs it again)" in reused.stderr
    assert manifest.stat().st_mtime_ns == written, "no verification ran, so no manifest was written"
    recorded = json.loads(manifest.read_text())
    assert recorded["passed"] and len(recorded["expected_sha256"]) == 64
    again = docker_env.ascendkit(*argv, "--reverify", cwd=tmp_path, check=True)
    assert json.loads(again.stdout)["verification"] == "ran"
    assert json.loads(manifest.read_text())["checks"] == recorded["checks"], "the same image verifies the same"
    changed = {**json.loads(manifest.read_text()), "expected_sha256": "0" * 64}  # as if the matrix expected something else
    manifest.write_text(json.dumps(changed))
    assert json.loads(docker_env.ascendkit(*argv, cwd=tmp_path, check=True).stdout)["verification"] == "ran"


DISTRIBUTIONS = """\
import json
from importlib.metadata import distributions
rows = {}
for d in distributions():
    rows[d.metadata["Name"].lower().replace("_", "-")] = [d.version, (d.read_text("INSTALLER") or "").strip()]
print(json.dumps(rows))
"""


def test_pip_and_uv_install_the_same_distributions(docker_env: DockerEnv, built: dict[str, Any], tmp_path: Path) -> None:
    """The installer changes how, not what: the test stack built with --installer pip holds exactly the
    distributions, at the same versions, as the default (uv) build, and each was installed by its installer."""
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin,
        "--installer", "pip", "--repo", f"pip-{uuid.uuid4().hex[:8]}/verl", "--json", "-q",
        cwd=tmp_path, check=True,
    )  # fmt: skip
    by_pip = json.loads(proc.stdout)
    assert by_pip["image_id"] != built["image_id"]

    def installed(image: str) -> dict[str, list[str]]:
        code, out, err = run_in_image(docker_env.client, image, ["python3", "-c", DISTRIBUTIONS])
        assert code == 0, err
        rows: dict[str, list[str]] = json.loads(out)
        return rows

    with_uv, with_pip = installed(built["tags"][0]), installed(by_pip["engine_id"])
    assert {name: row[0] for name, row in with_uv.items()} == {name: row[0] for name, row in with_pip.items()}
    lock = read_lock(TEST_MATRIX.parent / "locks" / "teststack-x86_64.txt")
    locked = {package.key for layer, package in lock.packages if layer != UV_LAYER}
    by_uv = {name for name, row in with_uv.items() if row[1] == "uv"}
    assert by_uv and by_uv <= locked
    assert not [name for name, row in with_pip.items() if row[1] == "uv"]
    # what neither installed, the base already had at its locked version (setuptools, wheel)
    assert {name: with_uv[name] for name in locked - by_uv} == {name: with_pip[name] for name in locked - by_uv}
    assert with_uv["uv"] == with_pip["uv"] == [load_matrix(TEST_MATRIX).matrix.installer.uv, "pip"]


def test_impossible_pin_fails_cleanly(docker_env: DockerEnv, tmp_path: Path) -> None:
    bad = tmp_path / "matrix.yaml"
    bad.write_text(TEST_MATRIX.read_text().replace('version: "3.7"', 'version: "99.0"'))
    write_unresolved_locks(bad)  # no lock can hold a pin that does not exist: pip meets it in the build
    before, repo = docker_env.containers(), own_repo("failing")
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(bad), "--base-image", docker_env.standin, "--repo", repo, "-q",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == ExitCode.BUILD_FAILED, proc.stderr
    assert "ascendkit: build failed at step" in proc.stderr
    assert "idna==99.0" in proc.stderr and "No matching distribution found for idna==99.0" in proc.stderr
    # the build's own word that the pins go in unhashed, in the failed step's last output: a step that
    # fails is never cached, so this is where it is seen whatever the engine's cache holds
    assert "WARNING: the x86_64 lock is unresolved; installing idna==99.0 by version pins, hashes NOT enforced" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert docker_env.client.images(name=repo) == []
    assert docker_env.containers() == before
    assert not (tmp_path / "manifests").exists()


def test_unreachable_base_image_fails_fast_with_the_options(docker_env: DockerEnv, tmp_path: Path) -> None:
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--matrix", str(TEST_MATRIX), "--base-image", "registry.invalid/ascend/cann:8.3.rc1-a3-ubuntu22.04-py3.11",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == ExitCode.UNAVAILABLE
    assert "is not on this engine and its registry cannot be reached" in proc.stderr
    assert "--base-registry" in proc.stderr and "--base-image REF" in proc.stderr


_STEP_OUTPUT = re.compile(r"^ +\| ")  # "      | + mkdir -p /etc/ascendkit": a line a step printed


@pytest.mark.engine_20_10
@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [(signal.SIGINT, ExitCode.INTERRUPTED, "interrupted (Ctrl-C)"), (signal.SIGTERM, ExitCode.TERMINATED, "terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_stopped_build_leaves_no_tag_container_or_manifest(
    docker_env: DockerEnv, tmp_path: Path, signum: signal.Signals, code: ExitCode, said: str
) -> None:
    """Ctrl-C and SIGTERM (how CI and Kubernetes stop a run) mid-step: the step's container goes,
    nothing is tagged, no manifest or SBOM is written; 130 for Ctrl-C, 143 for SIGTERM."""
    before = docker_env.containers()
    exe = Path(sys.executable).with_name("ascendkit")
    argv = [str(exe), "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin]
    repo = own_repo("interrupted")
    argv += ["--no-cache", "--repo", repo, "--manifest-dir", str(tmp_path / "manifests")]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=docker_env.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        # What a RUN step of this build prints, so a step is running right now. Not only its apt step's output:
        # a build the engine runs at the same time (a test beside this one under xdist) can have run that step
        # for both, and then this build shows none of it.
        if "apt-get update" in line or _STEP_OUTPUT.match(line):
            break
    proc.send_signal(signum)
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == code, "".join(seen) + rest
    assert f"ascendkit: {said}: the build was stopped; no tag was created and its containers were removed" in rest
    assert "Traceback" not in rest
    assert docker_env.client.images(name=repo) == []
    assert docker_env.containers() == before
    assert not (tmp_path / "manifests").exists() or not any((tmp_path / "manifests").iterdir())


@pytest.mark.engine_20_10
# The classic case on Docker 20.10 only, where users still build with the classic builder (Docker 26 gives it
# only when asked): its secrets are served alike on every engine, and on the containerd store its fifty steps,
# each a commit of its own, cost 95 core-seconds of the docker job, the longest of CI's jobs.
@pytest.mark.parametrize("builder", ["buildkit", pytest.param("classic", marks=pytest.mark.engine_20_10_only)])
def test_no_secrets_in_layers_config_or_history(docker_env: DockerEnv, secret_builds: Callable[[str], SecretBuild], builder: str) -> None:
    """BuildKit takes them as secret mounts (served instead on Docker 26's BuildKit, which would hash the
    root filesystem for them: the docker job's engine), the classic builder from a server for one build."""
    build = secret_builds(builder)  # a CA bundle with one certificate nobody else has, a credential in the index URLs
    assert build.result["builder"] == builder
    image_id = build.result["engine_id"]  # what this engine calls it (the containerd store: a manifest digest)
    token, unique = SECRET_TOKEN, build.unique
    assert token not in build.output  # nor in the build's own log

    found = scan_saved_image(
        docker_env.client,
        image_id,
        {"ca": unique, "token": token.encode(), "control": b"idna==3.7"},
    )
    assert found["control"], "the scan must find what the build did write (the pin in constraints.txt)"
    assert found["ca"] == [] and found["token"] == []

    history = json.dumps(docker_env.client.history(image_id))
    config = json.dumps(docker_env.client.inspect_image(image_id))
    for text in (history, config):
        # the one-build secret URL travels in ftp_proxy: its value must not be recorded anywhere
        # (the build-env helper's own text names the variable, which is fine)
        assert token not in text and unique.decode() not in text
        assert "ftp_proxy=" not in text and "http://127.0.0.1:" not in text
    assert "PIP_INDEX_URL=https://pypi.org/simple" in history  # the public part of the index URL is fine
    assert "ascendkit-bot" not in history + config


@pytest.mark.engine_20_10
# The classic case on Docker 20.10 only: the secrets are served to the classic builder alike on every
# engine, and on the containerd store its fifty steps before the failing one cost a minute of CPU.
@pytest.mark.parametrize("builder", ["buildkit", pytest.param("classic", marks=pytest.mark.engine_20_10_only)])
def test_the_ca_bundle_given_is_the_one_the_installing_steps_trust(docker_env: DockerEnv, tmp_path: Path, builder: str) -> None:
    """The bundle reaches pip whichever way the builder takes it: BuildKit's secret mounts (Docker 20.10),
    the secrets served to the classic builder, and to Docker 26's BuildKit, which would hash a step's whole
    root filesystem for a secret mount (buildkit/image/buildx.py). A bundle of a single certificate that
    signed nothing fails the first install on TLS. Where PyPI is reached directly that failure can only come
    from the bundle. Where the egress inspects TLS (these machines: a CA only the host trusts) a step given
    no bundle fails as well, and the proof is the other way round: every other build here is given the
    host's bundle and passes, which it could not without it (the plain `docker build` test, in
    test_builders.py, fails when not given it)."""
    cert, repo = certificate(tmp_path, "ascendkit-untrusted-ca"), own_repo(f"untrusted-{builder}")
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(TEST_MATRIX), "--base-image", docker_env.standin,
        "--ca-bundle", str(cert), "--no-cache", "--repo", repo, "--builder", builder, "--quiet",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == ExitCode.BUILD_FAILED, proc.stderr[-3000:]
    untrusted = r"certificate verify failed|CERTIFICATE_VERIFY_FAILED|invalid peer certificate|UnknownIssuer"
    assert re.search(untrusted, proc.stderr), proc.stderr[-3000:]
    assert docker_env.client.images(name=repo) == []


def test_unresolved_lock_builds_by_pins_and_says_so(docker_env: DockerEnv, tmp_path: Path) -> None:
    """What an arch whose index was unreachable at lock time gets: the version pins, loudly. Said by
    ascendkit before the build and by the manifest after it, both whether or not the engine's cache
    already held these steps (the build's own warning is then not printed: see the impossible pin)."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(TEST_MATRIX.read_text())
    write_unresolved_locks(matrix, "index pypi-again could not be reached (test)")
    proc = docker_env.ascendkit(
        "build", "--hw", "a3", "--arch", "x86_64", "--matrix", str(matrix), "--base-image", docker_env.standin,
        "--repo", "unlocked/verl", "--json",
        cwd=tmp_path, check=True,
    )  # fmt: skip
    assert "ascendkit: warning: locks/teststack-x86_64.txt is unresolved (index pypi-again could not be reached (test))" in proc.stderr
    manifest = json.loads((tmp_path / json.loads(proc.stdout)["manifest"]).read_text())
    lock_check = next(c for c in manifest["checks"] if c["name"] == "lock")
    assert lock_check == {
        "name": "lock",
        "status": "warn",
        "detail": "expected hash-locked install, found locks/teststack-x86_64.txt is unresolved: pins installed unhashed",
        "expected": "hash-locked install",
        "actual": "locks/teststack-x86_64.txt is unresolved: pins installed unhashed",
    }
    idna = next(c for c in manifest["checks"] if c["name"] == "package idna")  # what the image holds, probed
    assert (idna["status"], idna["actual"]) == ("ok", "3.7")


def _next_stack(text: str, start: int) -> int:
    """Where the stack that begins at ``start`` of the matrix's text ends: the next key at its indent."""
    found = re.compile(r"^  [a-z]", re.M).search(text, start + 1)
    assert found is not None, "the test matrix ends with its OpenRLHF stack"
    return found.start()


def _with_broken_stack(tmp_path: Path) -> Path:
    """The test matrix (less its SGLang-shaped stack) plus 'broken', a copy of teststack (planted: a
    triton-ascend pin that does not exist, so pip fails in its second layer) that builds first."""
    text = TEST_MATRIX.read_text()
    start = text.index("  teststack:\n")
    stanza = text[start : _next_stack(text, start)]
    broken = (
        stanza.replace("  teststack:\n", "  broken:\n")
        .replace("default: true", "default: false")
        .replace('version: "3.7"', 'version: "3.6"')  # its own full tag
        .replace("version: 0.2.13", "version: 0.0.0")  # the planted failure
    )
    sglang = text.index("  teststack-sglang:\n")  # served by its own stand-in index: not one of these two
    text = text[:sglang] + text[_next_stack(text, sglang) :]
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text + broken)
    shutil.copytree(TEST_MATRIX.parent / "locks", tmp_path / "locks")
    loaded = load_matrix(matrix)
    for target in lock_targets(loaded, "broken"):
        (tmp_path / target.path).write_text(render_unresolved(lock_inputs(loaded, target), "test: planted failure"))
    return matrix


def test_build_all_goes_on_past_a_failed_target_and_never_tags_it(docker_env: DockerEnv, tmp_path: Path) -> None:
    """Two stacks for a3/x86_64: 'broken' (planted: a triton-ascend pin that does not exist, so pip
    fails in its second layer) builds first; the run goes on, builds and tags 'teststack', and
    prints the summary; nothing of 'broken' is tagged."""
    matrix = _with_broken_stack(tmp_path)
    repo = f"it-fleet-{uuid.uuid4().hex[:8]}/verl"
    before = docker_env.containers()
    proc = docker_env.ascendkit(
        "build", "--all", "--hw", "a3", "--arch", "x86_64", "--matrix", str(matrix), "--base-image", docker_env.standin,
        "--repo", repo, "--manifest-dir", str(tmp_path / "manifests"), "--json", "-q",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == ExitCode.BUILD_FAILED, proc.stderr
    outcomes = {o["target"]: o for o in json.loads(proc.stdout)}
    assert list(outcomes) == ["broken a3 debian12 x86_64", "teststack a3 debian12 x86_64"]
    failed, built = outcomes["broken a3 debian12 x86_64"], outcomes["teststack a3 debian12 x86_64"]
    assert failed["result"] == "failed" and failed["exit_code"] == ExitCode.BUILD_FAILED and "build failed at step" in failed["message"]
    assert built["result"] == "built" and built["size"] > 0 and built["image_id"].startswith("sha256:")
    assert proc.stderr.index("[1/2] building") < proc.stderr.index("[2/2] building"), "broken went first; the run went on"
    assert "ascendkit build --all: 1 of 2 built" in proc.stderr and "FAILED" in proc.stderr
    tags = {tag for image in docker_env.client.images(name=repo) for tag in image["RepoTags"] or []}
    assert f"{repo}:teststack-a3-x86_64" in tags
    assert not any("broken" in tag or "verl3.6" in tag for tag in tags), tags
    assert docker_env.containers() == before


def test_sigterm_stops_build_all_with_a_summary_and_nothing_tagged(docker_env: DockerEnv, tmp_path: Path) -> None:
    """SIGTERM during the first of two targets: its step container goes, the summary says
    'interrupted' for it and 'not started' for the other, exit 143; no tag, container or manifest."""
    matrix = _with_broken_stack(tmp_path)
    repo = f"it-stop-{uuid.uuid4().hex[:8]}/verl"
    before = docker_env.containers()
    exe = Path(sys.executable).with_name("ascendkit")
    argv = [str(exe), "build", "--all", "--hw", "a3", "--arch", "x86_64", "--matrix", str(matrix), "--base-image", docker_env.standin]
    argv += ["--no-cache", "--repo", repo, "--manifest-dir", str(tmp_path / "manifests"), "--json"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=docker_env.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "apt-get update" in line:
            break
    proc.send_signal(signal.SIGTERM)
    stdout, rest = proc.communicate(timeout=180)
    assert proc.returncode == ExitCode.TERMINATED, "".join(seen) + rest
    outcomes = {o["target"]: o for o in json.loads(stdout)}
    assert outcomes["broken a3 debian12 x86_64"]["result"] == "interrupted"
    assert "terminated (SIGTERM): the build was stopped" in outcomes["broken a3 debian12 x86_64"]["message"]
    assert outcomes["teststack a3 debian12 x86_64"]["result"] == "not started"
    assert "0 of 2 built" in rest and "Traceback" not in rest
    assert docker_env.client.images(name=repo) == []
    assert docker_env.containers() == before
    assert not (tmp_path / "manifests").exists() or not any((tmp_path / "manifests").iterdir())
