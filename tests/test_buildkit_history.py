"""A build BuildKit failed after its image was exported, on recording it in its history (BuildKit before
v0.14 gives that 20 s: moby/buildkit#4327): read from what buildx printed when it happened
(tests/fixtures/buildkit/rawjson-history-deadline.txt), and built again by ``build_with_buildx`` through a
buildx that replays it (a stand-in: tests/test_engine_stall.py brings the case about on the real engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildkit.errors import BuildFailed
from buildkit.image.buildplan import BuildPlan, plan_build
from buildkit.image.buildx import BUILDKIT, Builder
from buildkit.image.progress import QuietReporter, Step
from buildkit.image.solve import SolveProgress
from buildkit.image.with_buildx import HISTORY_TRIES, build_with_buildx
from buildkit.matrix.load import load_matrix

FIXTURES = Path(__file__).parent / "fixtures" / "buildkit"
CONFIG = "sha256:" + "c0" * 32


class Notes:
    def __init__(self) -> None:
        self.notes: list[str] = []
        self.started: list[int] = []

    def step_started(self, step: Step) -> None:
        self.started.append(step.number)

    def step_finished(self, step: Step) -> None:
        pass

    def output(self, step: Step | None, line: str) -> None:
        pass

    def note(self, line: str) -> None:
        self.notes.append(line)


def _read(name: str, code: int) -> SolveProgress:
    progress = SolveProgress()
    progress.feed_text((FIXTURES / f"rawjson-{name}.txt").read_text())
    progress.close()
    progress.settle(code)
    return progress


def test_what_buildx_printed_is_a_build_failed_after_its_export_not_a_failed_step() -> None:
    progress = _read("history-deadline", 1)
    assert progress.exported and progress.unrecorded and progress.failed is None
    assert [s.number for s in progress.steps] == [1, 2, 3, 4] and all(s.finished is not None for s in progress.steps)
    message = progress.failure_message()
    assert message.startswith(
        "BuildKit built and exported the image, then failed the build on recording it in its history "
        "(failed to solve: DeadlineExceeded: context deadline exceeded): BuildKit before v0.14"
    )
    assert "moby/buildkit#4327" in message and "step 4/4" not in message


def test_only_that_failure_is_taken_for_it() -> None:
    failed = _read("failed", 1)  # a step failed: nothing was exported
    assert not failed.exported and not failed.unrecorded and failed.failure_message().startswith("build failed at step 4/4")
    assert not _read("cached", 0).unrecorded  # exported, and buildx exited 0
    other = SolveProgress()  # exported, then another error: said as it is, not built again
    other.feed_status({"vertexes": [{"digest": "sha256:9", "name": "exporting to image", "started": "t", "completed": "t"}]})
    other.feed_text("ERROR: failed to solve: rpc error: code = Unavailable desc = error reading from server: EOF\n")
    other.close()
    other.settle(1)
    assert other.exported and not other.unrecorded
    assert other.failure_message() == (
        "BuildKit built and exported the image, then failed the build: "
        "failed to solve: rpc error: code = Unavailable desc = error reading from server: EOF"
    )


def _replaying_buildx(tmp_path: Path, failures: int) -> Path:
    """A docker-buildx whose first ``failures`` builds print the transcript of the failed recording and exit 1;
    later ones print another build's (two of its three steps cached) and write the metadata a real one writes.
    Each build's argv is kept."""
    script = tmp_path / "docker-buildx"
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = build ] || exit 2\n'
        f'echo "$*" >> "{tmp_path}/builds"\n'
        f'if [ "$(wc -l < "{tmp_path}/builds")" -le {failures} ]; then cat "{FIXTURES}/rawjson-history-deadline.txt"; exit 1; fi\n'
        "while [ $# -gt 0 ]; do\n"
        f'  if [ "$1" = --metadata-file ]; then printf \'{{"containerimage.config.digest": "{CONFIG}"}}\' > "$2"; fi\n'
        "  shift\n"
        "done\n"
        f'cat "{FIXTURES}/rawjson-built.txt"\n'
    )
    script.chmod(0o755)
    return script


class Engine:
    """The one call ``build_with_buildx`` makes of the engine: the image BuildKit loaded, by its config digest."""

    def inspect_image(self, ref: str) -> dict[str, str]:
        return {"Id": ref}


def _plan() -> BuildPlan:
    matrix = load_matrix(Path(__file__).parent / "fixtures" / "test_matrix.yaml")
    return plan_build(matrix, "a3", arch="x86_64", use_default_ca=False, no_cache=True)


def test_built_again_from_cache_and_the_first_builds_steps_kept(tmp_path: Path) -> None:
    builder = Builder(BUILDKIT, "buildx 0.13.1, BuildKit v0.13.2", (str(_replaying_buildx(tmp_path, failures=1)),))
    shown = Notes()
    engine_id, config, progress = build_with_buildx(Engine(), _plan(), builder, SolveProgress(shown))  # type: ignore[arg-type]
    assert (engine_id, config) == (CONFIG, CONFIG)
    builds = (tmp_path / "builds").read_text().splitlines()
    assert len(builds) == 2 and "--no-cache" in builds[0].split()
    assert "--no-cache" not in builds[1].split(), "the second takes what the first built from cache"
    note = f"BuildKit built the image, then failed on recording it in its history: built again from cache (2 of {HISTORY_TRIES})"
    assert shown.notes == [note] and progress.warnings == [note]
    assert progress.error is None and not progress.unrecorded
    assert (progress.cached_steps, progress.cacheable_steps) == (3, 3), "the first build's count, not the second's (2 of 3)"
    assert shown.started == [1, 2, 3, 4, 1, 2, 3, 4], "both builds are shown"


def test_a_reporter_without_note_still_serves(tmp_path: Path) -> None:
    builder = Builder(BUILDKIT, "buildx 0.13.1, BuildKit v0.13.2", (str(_replaying_buildx(tmp_path, failures=1)),))
    quiet = QuietReporter()  # as one written for buildkit.api.build before note() came: the three methods alone
    assert not hasattr(quiet, "note")
    _, _, progress = build_with_buildx(Engine(), _plan(), builder, SolveProgress(quiet))  # type: ignore[arg-type]
    assert progress.warnings[0].endswith(f"built again from cache (2 of {HISTORY_TRIES})")


def test_the_last_try_failing_is_the_failure(tmp_path: Path) -> None:
    builder = Builder(BUILDKIT, "buildx 0.13.1, BuildKit v0.13.2", (str(_replaying_buildx(tmp_path, failures=99)),))
    shown = Notes()
    with pytest.raises(BuildFailed, match=r"^BuildKit built and exported the image, then failed the build on recording it in its history"):
        build_with_buildx(Engine(), _plan(), builder, SolveProgress(shown))  # type: ignore[arg-type]
    assert len((tmp_path / "builds").read_text().splitlines()) == HISTORY_TRIES
    assert [n[-7:] for n in shown.notes] == [f"{n} of {HISTORY_TRIES})" for n in range(2, HISTORY_TRIES + 1)]


def test_a_failed_step_is_not_built_again(tmp_path: Path) -> None:
    script = tmp_path / "docker-buildx"
    script.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/builds"\ncat "{FIXTURES}/rawjson-failed.txt"\nexit 1\n')
    script.chmod(0o755)
    with pytest.raises(BuildFailed, match=r"^build failed at step 4/4 .*exited with code 3"):
        build_with_buildx(Engine(), _plan(), Builder(BUILDKIT, "buildx 0.13.1", (str(script),)), SolveProgress())  # type: ignore[arg-type]
    assert len((tmp_path / "builds").read_text().splitlines()) == 1
