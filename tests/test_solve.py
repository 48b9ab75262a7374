"""BuildKit's solve status read as build steps (buildkit/image/solve.py), from what buildx really
printed (tests/fixtures/buildkit/), and how the builder is chosen (buildkit/image/buildx.py)."""

from __future__ import annotations

import base64
import hashlib
import random
import re
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildkit.errors import InputError, Unavailable
from buildkit.image import buildx
from buildkit.image.buildplan import plan_build
from buildkit.image.buildx import BUILDKIT, CLASSIC, choose_builder, secret_files, serves_secrets
from buildkit.image.engine import CONTAINERD_STORE, GRAPH_DRIVER_STORE, PODMAN_STORE, EngineFacts
from buildkit.image.progress import Step
from buildkit.image.solve import SolveProgress
from buildkit.image.with_buildx import on_loopback
from buildkit.matrix.load import load_matrix
from buildkit.settings import Mirrors

FIXTURES = Path(__file__).parent / "fixtures" / "buildkit"


def test_the_recorded_transcripts_are_what_buildx_printed() -> None:
    """Each transcript's sha256 as its README records it when it was captured."""
    listed = dict(re.findall(r"\| `(rawjson-[a-z-]+\.txt)` \| `([0-9a-f]{64})` \|", (FIXTURES / "README.md").read_text()))
    present = sorted(p.name for p in FIXTURES.glob("rawjson-*.txt"))
    assert sorted(listed) == present and len(present) == 5
    for name, digest in listed.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int, str]] = []

    def step_started(self, step: Step) -> None:
        self.events.append(("started", step.number, step.instruction))

    def step_finished(self, step: Step) -> None:
        self.events.append(("finished", step.number, "cached" if step.cached else "ran"))

    def output(self, step: Step | None, line: str) -> None:
        self.events.append(("output", step.number if step else 0, line))


def _read(name: str, chunks: int = 1, seed: int = 0) -> tuple[SolveProgress, Recorder]:
    """The transcript fed in ``chunks`` pieces cut at random places (a pipe gives no JSON boundaries)."""
    text = (FIXTURES / f"rawjson-{name}.txt").read_text()
    cuts = sorted(random.Random(seed).sample(range(1, len(text)), chunks - 1)) if chunks > 1 else []
    recorder = Recorder()
    progress = SolveProgress(recorder)
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        progress.feed_text(text[start:end])
    progress.close()
    return progress, recorder


@pytest.mark.parametrize("chunks", [1, 7, 300])
def test_a_failed_step_is_named_with_its_exit_code_and_last_output(chunks: int) -> None:
    progress, recorder = _read("failed", chunks, seed=chunks)
    assert [(s.number, s.total) for s in progress.steps] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert progress.steps[2].instruction == 'RUN echo "one line"; echo "to stderr" >&2'  # its --mount flags not shown
    assert list(progress.steps[2].output) == ["one line", "to stderr"]
    message = progress.failure_message()
    assert message.startswith('build failed at step 4/4 (RUN echo "before the failure"; exit 3 ...): the command exited with code 3')
    assert message.endswith("last output:\n    before the failure")
    assert ("output", 3, "to stderr") in recorder.events and ("finished", 4, "ran") in recorder.events
    assert any(line.startswith("ERROR: failed to solve:") for line in progress.last_words)


def test_steps_from_cache_are_counted_as_the_classic_builder_counts_them() -> None:
    """FROM never counts (neither builder caches it); COPY and RUN do."""
    built, _ = _read("built", 5)
    assert (built.cached_steps, built.cacheable_steps, built.error) == (2, 3, None)
    cached, recorder = _read("cached", 11, seed=3)
    assert (cached.cached_steps, cached.cacheable_steps, cached.error) == (3, 3, None)
    assert [e for e in recorder.events if e[0] == "finished"] == [("finished", 1, "ran")] + [("finished", n, "cached") for n in (2, 3, 4)]


def test_an_unreachable_registry_cache_is_a_warning_not_a_failure() -> None:
    """What buildx printed with the cache registry down: the image was built (exit 0) without it."""
    progress, _ = _read("cache-unreachable", 4)
    assert progress.error is None and progress.cacheable_steps == 3
    read, written = progress.warnings
    assert read.startswith("the registry cache was not read: every step without a local cache ran (failed to configure registry cache")
    assert written.startswith("the registry cache was not written (error writing layer blob:") and "connection refused" in written


def test_a_failed_cache_export_is_a_warning_not_a_failure() -> None:
    progress = SolveProgress()
    progress.feed_status({"vertexes": [{"digest": "sha256:1", "name": "[1/2] FROM docker.io/library/x", "started": "t", "completed": "t"}]})
    progress.feed_status(
        {"vertexes": [{"digest": "sha256:9", "name": "exporting cache to registry", "started": "t", "error": "503 Service Unavailable"}]}
    )
    progress.close()
    assert progress.error is None
    assert progress.warnings == ["the registry cache was not written (503 Service Unavailable)"]


_KILLED = 'process "/bin/sh -c set -eux; apt-get update" did not complete successfully: exit code: 137'


def _shared_step_statuses(second_run: str | None) -> list[dict[str, object]]:
    """The statuses one build gets for a step it holds together with another build, which was stopped while
    the step ran for it alone: BuildKit kills the step's process, the error shows in both builds' status, and
    this build's own request for the step runs it again. Its status keeps the old error from then on (BuildKit
    sets a vertex's error and never clears it): ``second_run`` is what the second run itself said, None when
    it succeeded."""
    run = {"digest": "sha256:2", "name": "[2/3] RUN set -eux; apt-get update"}

    def log(text: str) -> dict[str, object]:
        return {"logs": [{"vertex": "sha256:2", "stream": 2, "data": base64.b64encode(text.encode()).decode()}]}

    statuses: list[dict[str, object]] = [
        {"vertexes": [{"digest": "sha256:1", "name": "[1/3] FROM docker.io/library/x", "started": "t0", "completed": "t0"}]},
        {"vertexes": [{**run, "started": "t1"}]},
        log("+ apt-get update\n"),
        {"vertexes": [{**run, "started": "t1", "completed": "t2", "error": _KILLED}]},
        {"vertexes": [{**run, "started": "t3", "error": _KILLED}]},
        log("+ apt-get update\nFetched 15.0 MB in 4s\n"),
        {"vertexes": [{**run, "started": "t3", "completed": "t4", "error": second_run or _KILLED}]},
    ]
    if second_run is None:  # the rest of the build
        statuses.append({"vertexes": [{"digest": "sha256:3", "name": "[3/3] WORKDIR /workspace", "started": "t5", "completed": "t5"}]})
        statuses.append({"vertexes": [{"digest": "sha256:9", "name": "exporting to image", "started": "t6", "completed": "t6"}]})
    return statuses


@pytest.mark.parametrize("coalesced", [False, True], ids=["each-status", "coalesced"])
def test_a_shared_step_killed_for_another_build_and_run_again_does_not_fail_this_one(coalesced: bool) -> None:
    """What failed docker's CI once: a build stopped mid-step took the step's process with it, and the other
    build, which shared that step, succeeded (buildx exit 0) but was reported failed at the killed step.
    ``coalesced``: the second run's start not sent apart from its end (BuildKit sends a vertex's latest state)."""
    recorder = Recorder()
    progress = SolveProgress(recorder)
    statuses = _shared_step_statuses(None)
    for status in statuses[:4] + statuses[5:] if coalesced else statuses:
        progress.feed_status(status)
    progress.close()
    progress.settle(0)
    assert progress.error is None and progress.failed is None
    assert progress.warnings == [f"step 2/3 was stopped ({_KILLED}) and BuildKit ran it again"]
    assert [e[:2] for e in recorder.events if e[0] != "output"] == [
        ("started", 1),
        ("finished", 1),
        ("started", 2),
        ("finished", 2),
        ("started", 2),
        ("finished", 2),
        ("started", 3),
        ("finished", 3),
    ]
    assert list(progress.steps[1].output)[-1] == "Fetched 15.0 MB in 4s"


@pytest.mark.parametrize(
    "second_run",
    [None, 'process "/bin/sh -c set -eux; apt-get update" did not complete successfully: exit code: 100'],
    ids=["killed-again", "an-error-of-its-own"],
)
def test_a_shared_step_that_fails_when_run_again_is_the_failure(second_run: str | None) -> None:
    """The second run killed the same way (the status cannot tell: the old error is still on it) or failing
    with an error of its own: buildx's exit code says the build failed, and this step is named."""
    progress = SolveProgress()
    for status in _shared_step_statuses(second_run or _KILLED):
        progress.feed_status(status)
    progress.close()
    progress.settle(1)
    assert progress.failed is progress.steps[1]
    code = "100" if second_run else "137"
    assert progress.failure_message().startswith(
        f"build failed at step 2/3 (RUN set -eux; apt-get update ...): the command exited with code {code}"
    )


def test_buildx_exiting_0_is_a_build_that_succeeded() -> None:
    """Whatever a step's status said on the way, exit 0 with an image is success, and what was said is a warning."""
    progress = SolveProgress()
    progress.feed_status(
        {"vertexes": [{"digest": "sha256:2", "name": "[2/2] RUN true", "started": "t1", "completed": "t2", "error": "odd"}]}
    )
    progress.close()
    assert progress.error == "odd"
    progress.settle(0)
    assert progress.error is None and progress.warnings == ["BuildKit reported an error on the way (odd), and the build succeeded"]


def _engine(store: str = CONTAINERD_STORE, product: str = "Docker Engine") -> EngineFacts:
    return EngineFacts(product, "26.1.5", "1.45", store, "overlayfs")


@pytest.fixture
def no_buildx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("ASCENDKIT_BUILDX", str(tmp_path / "docker-buildx-missing"))
    buildx.find_buildx.cache_clear()
    buildx._current_builder.cache_clear()
    yield
    buildx.find_buildx.cache_clear()
    buildx._current_builder.cache_clear()


@pytest.fixture
def fake_buildx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A docker-buildx that answers `version` and `inspect` as 0.13.1 does (a stand-in: no engine here)."""
    script = tmp_path / "docker-buildx"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  version) echo 'github.com/docker/buildx 0.13.1+ds1 0.13.1+ds1-3' ;;\n"
        "  inspect) printf 'Name:          default\\nDriver:        docker\\n\\nNodes:\\nBuildKit version: v0.13.2\\n' ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("ASCENDKIT_BUILDX", str(script))
    buildx.find_buildx.cache_clear()
    buildx._current_builder.cache_clear()
    yield script
    buildx.find_buildx.cache_clear()
    buildx._current_builder.cache_clear()


def test_buildkit_where_buildx_answers(fake_buildx: Path) -> None:
    for choice in ("auto", "buildkit"):
        builder = choose_builder(choice, _engine())
        assert (builder.name, builder.version, builder.command) == (BUILDKIT, "buildx 0.13.1+ds1, BuildKit v0.13.2", (str(fake_buildx),))
    assert choose_builder("auto", _engine(GRAPH_DRIVER_STORE)).name == BUILDKIT
    assert choose_builder("classic", _engine()).describe() == {"name": CLASSIC, "version": "Docker Engine 26.1.5"}


@pytest.mark.parametrize(
    ("driver", "buildkit", "engine", "served"),
    [
        ("docker", "v0.13.2", "26.1.5", True),  # moby/buildkit#5251: a secret mount hashes the root filesystem
        ("docker", "v0.15.1", "27.1.1", True),
        ("docker", "v0.16.0", "27.3.1", False),  # fixed
        ("docker", "v0.12.5", "25.0.5", False),  # before the regression
        ("docker", "v0.0.0+unknown", "26.1.5", True),  # Debian's buildx: the engine's version says it
        ("docker", "", "27.2.1", True),
        ("docker", "v0.0.0+unknown", "27.3.0", False),
        ("docker", "v0.0.0+unknown", "20.10.24", False),
        ("docker-container", "v0.13.2", "26.1.5", False),  # its host network is an entitlement: the mounts stay
    ],
)
def test_buildkit_that_hashes_the_root_filesystem_for_a_secret_mount_is_served_its_secrets(
    driver: str, buildkit: str, engine: str, served: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(buildx.SECRETS_ENV, raising=False)
    facts = EngineFacts("Docker Engine", engine, "1.45", CONTAINERD_STORE, "overlayfs")
    assert serves_secrets(driver, buildkit, facts) is served
    assert not serves_secrets(driver, "", EngineFacts("Podman", engine, "1.41", PODMAN_STORE, "overlay"))  # not Docker's versions
    assert not serves_secrets(driver, buildkit, facts, local=False)  # its steps could not reach a server here


def test_only_an_engine_in_this_network_namespace_is_served_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The served secrets are on 127.0.0.1 here: an engine elsewhere (tcp, ssh, a socket nobody answers)
    keeps the mounts; one answering on a socket from this very network namespace gets them served."""
    path = tmp_path / "engine.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:  # this process plays the engine
        server.bind(str(path))
        server.listen(4)
        cases = [(f"unix://{path}", True), ("tcp://10.0.0.5:2376", False), ("ssh://ci@builder", False), (f"unix://{tmp_path}/none", False)]
        for host, local in cases:
            monkeypatch.setenv("DOCKER_HOST", host)
            assert buildx.shares_the_engines_loopback() is local, host


def test_the_secrets_channel_can_be_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed = EngineFacts("Docker Engine", "28.2.2", "1.50", CONTAINERD_STORE, "overlayfs")
    monkeypatch.setenv(buildx.SECRETS_ENV, "served")
    assert serves_secrets("docker", "v0.23.0", fixed)
    monkeypatch.setenv(buildx.SECRETS_ENV, "mounts")
    assert not serves_secrets("docker", "v0.13.2", _engine())
    monkeypatch.setenv(buildx.SECRETS_ENV, "tmpfs")
    with pytest.raises(InputError, match="ASCENDKIT_BUILDKIT_SECRETS='tmpfs': set it to mounts or served"):
        serves_secrets("docker", "v0.13.2", _engine())


def test_docker_26s_buildkit_builds_the_render_without_secret_mounts(fake_buildx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same steps, and the same RUN commands (the history an image records): only the secret mounts go."""
    monkeypatch.delenv(buildx.SECRETS_ENV, raising=False)
    monkeypatch.setattr(buildx, "shares_the_engines_loopback", lambda: True)  # no engine here: as on the machine's own
    assert choose_builder("auto", _engine()).serves_secrets  # buildx 0.13.1 says BuildKit v0.13.2
    plan = plan_build(load_matrix(Path(__file__).parent / "fixtures" / "test_matrix.yaml"), "a3", arch="x86_64", use_default_ca=False)
    mounts, served = plan.dockerfile_for(BUILDKIT), plan.dockerfile_for(BUILDKIT, served=True)
    secret_line = "    --mount=type=secret,id=ascendkit-ca --mount=type=secret,id=ascendkit-env \\\n"
    assert mounts.count(secret_line) == mounts.count("--mount=type=cache") > 5
    assert served == mounts.replace(secret_line, "") and "--mount=type=secret" not in served
    assert plan.dockerfile_for(CLASSIC, served=True) == plan.dockerfile_for(CLASSIC)


def test_classic_where_it_must_and_a_clear_error_where_buildkit_was_asked_for(no_buildx: None) -> None:
    builder = choose_builder("auto", _engine())
    assert builder.name == CLASSIC and builder.note.startswith("BuildKit is not available (`")
    assert "building with the classic builder" in builder.note
    with pytest.raises(Unavailable, match=r"--builder buildkit, which this machine cannot give .*apt install docker-buildx"):
        choose_builder("buildkit", _engine())
    with pytest.raises(Unavailable, match="--cache-repo needs BuildKit"):
        choose_builder("auto", _engine(), cache=True)
    with pytest.raises(InputError, match="--cache-repo needs BuildKit"):
        choose_builder("classic", _engine(), cache=True)


def test_a_registry_cache_with_the_docker_driver_needs_the_containerd_store(fake_buildx: Path) -> None:
    """buildx's docker driver on a graph-driver engine cannot export a cache: said before the build."""
    assert choose_builder("auto", _engine(CONTAINERD_STORE), cache=True).name == BUILDKIT
    with pytest.raises(Unavailable, match=r"only from Docker's containerd image store.*--driver docker-container"):
        choose_builder("auto", _engine(GRAPH_DRIVER_STORE), cache=True)
    assert choose_builder("auto", _engine(GRAPH_DRIVER_STORE), cache=True, export=False).name == BUILDKIT  # importing: any driver
    fake_buildx.write_text(fake_buildx.read_text().replace("Driver:        docker", "Driver:        docker-container"))
    buildx._current_builder.cache_clear()  # another builder: asked again
    assert choose_builder("auto", _engine(GRAPH_DRIVER_STORE), cache=True).name == BUILDKIT


def test_podman_builds_with_the_classic_api(fake_buildx: Path) -> None:
    builder = choose_builder("auto", _engine(PODMAN_STORE, "Podman"))
    assert builder.name == CLASSIC and "Podman builds through buildah" in builder.note


def test_an_old_buildx_is_not_used(monkeypatch: pytest.MonkeyPatch, fake_buildx: Path) -> None:
    fake_buildx.write_text(fake_buildx.read_text().replace("0.13.1+ds1 0.13.1+ds1-3", "v0.11.2 9872040"))
    buildx.find_buildx.cache_clear()
    buildx._current_builder.cache_clear()
    assert choose_builder("auto", _engine()).note.startswith("BuildKit is not available (buildx 0.11.2 is older than 0.12)")


def test_secret_files_are_private_and_only_what_there_is(tmp_path: Path) -> None:
    flags = secret_files(tmp_path, b"-----BEGIN CERTIFICATE-----\n", b"")
    assert flags == ["--secret", f"id=ascendkit-ca,src={tmp_path / 'ascendkit-ca'}"]
    assert stat.S_IMODE((tmp_path / "ascendkit-ca").stat().st_mode) == 0o600
    assert not (tmp_path / "ascendkit-env").exists()


def test_a_mirror_on_loopback_gives_the_build_the_hosts_network() -> None:
    """BuildKit's steps have a network of their own: a mirror on 127.0.0.1 (a git server, a devpi)
    is reached only with the host's network, which is asked for then and only then (a
    docker-container builder refuses it unless its network.host entitlement is granted)."""
    matrix = load_matrix(Path(__file__).parent / "fixtures" / "test_matrix.yaml")
    assert not on_loopback(plan_build(matrix, "a3", arch="x86_64", use_default_ca=False))
    for url in ("http://127.0.0.1:3141/root/pypi/+simple", "https://bot:s3cret@localhost/simple"):
        plan = plan_build(matrix, "a3", arch="x86_64", use_default_ca=False, mirrors=Mirrors({"pip_index_url": url}))
        assert on_loopback(plan), url


def test_a_stopped_build_leaves_its_running_step_unfinished() -> None:
    """Ctrl-C mid-step: the step is not reported done (buildx was stopped, not finished)."""
    recorder = Recorder()
    progress = SolveProgress(recorder)
    progress.feed_status({"vertexes": [{"digest": "sha256:2", "name": "[stage-0 2/3] RUN sleep 60", "started": "t"}]})
    progress.close(ended=False)
    assert progress.steps[0].finished is None
    assert recorder.events == [("started", 2, "RUN sleep 60")]


def test_a_line_buildkit_cut_in_two_is_shown_whole() -> None:
    """BuildKit sends a step's output as it was written, cut anywhere: a line cut between two log
    records (as happens under load) is shown, and kept for the failure message, in one piece."""
    recorder = Recorder()
    progress = SolveProgress(recorder)
    vertex = {"digest": "sha256:3", "name": "[stage-0 3/3] RUN uv pip install", "started": "t"}
    progress.feed_status({"vertexes": [vertex]})
    for piece in (b"Installed 1 package\n + markups", b"afe==2.0.1\n + idna", b"==3.7"):
        progress.feed_status({"logs": [{"vertex": "sha256:3", "stream": 2, "data": base64.b64encode(piece).decode()}]})
    progress.feed_status({"vertexes": [{**vertex, "completed": "t"}]})
    progress.close()
    assert list(progress.steps[0].output) == ["Installed 1 package", " + markupsafe==2.0.1", " + idna==3.7"]
    assert [e for e in recorder.events if e[0] != "started"][-1] == ("finished", 3, "ran")  # the last line before the step ends
