"""Parsing the classic builder's stream into steps, cache hits, containers and failures."""

from __future__ import annotations

from typing import Any

from buildkit.image.progress import BuildProgress, Step

STREAM: list[dict[str, Any]] = [
    {"stream": "Step 1/6 : ARG BASE_IMAGE=x\n"},
    {"stream": "Step 2/6 : FROM ${BASE_IMAGE}\n"},
    {"stream": " ---> 85a22c5c19a9\n"},
    {"stream": "Step 3/6 : ARG BASE_IMAGE\n"},
    {"stream": " ---> Using cache\n"},
    {"stream": " ---> 72584803aebc\n"},
    {"stream": "Step 4/6 : RUN set -eux;     pip install six==1.16.0\n"},
    {"stream": " ---> Running in b5dbb7d0aed5\n"},
    {"stream": "Collecting six==1.16.0\n"},
    {"stream": "\n"},
    {"stream": "Installing collected packages: six\nSuccessfully installed six-1.16.0\n"},
    {"stream": "Removing intermediate container b5dbb7d0aed5\n"},
    {"stream": " ---> 98ea4c035483\n"},
    {"stream": "Step 5/6 : RUN pip install idna==99.0\n"},
    {"stream": " ---> Running in fe6060ef8766\n"},
    {"stream": "ERROR: No matching distribution found for idna==99.0\n"},
    {"error": "The command '/bin/sh -c pip install idna==99.0' returned a non-zero code: 1", "errorDetail": {"code": 1}},
]


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def step_started(self, step: Step) -> None:
        self.events.append(f"start {step.number}")

    def step_finished(self, step: Step) -> None:
        self.events.append(f"end {step.number} {'cached' if step.cached else 'ran'}")

    def output(self, step: Step | None, line: str) -> None:
        self.events.append(f"out {line}")


def test_steps_cache_and_containers() -> None:
    recorder = Recorder()
    progress = BuildProgress(recorder)
    for event in STREAM:
        progress.feed(event)
    progress.close()
    assert [s.number for s in progress.steps] == [1, 2, 3, 4, 5]
    assert [s.cacheable for s in progress.steps] == [False, False, True, True, True]
    assert progress.cached_steps == 1 and progress.cacheable_steps == 3
    assert progress.containers == ["b5dbb7d0aed5", "fe6060ef8766"]
    assert "out Successfully installed six-1.16.0" in recorder.events
    assert "out " not in recorder.events  # blank lines dropped
    assert recorder.events.index("end 4 ran") < recorder.events.index("start 5")


def test_failure_names_the_step_and_shows_its_tail() -> None:
    progress = BuildProgress()
    for event in STREAM:
        progress.feed(event)
    message = progress.failure_message()
    assert message.startswith("build failed at step 5/6 (RUN pip install idna==99.0 ...): the command exited with code 1")
    assert "    ERROR: No matching distribution found for idna==99.0" in message
    assert "Collecting six" not in message  # only the failing step's output


def test_success_records_image_id() -> None:
    progress = BuildProgress()
    for event in [*STREAM[:13], {"stream": "Successfully built 98ea4c035483\n"}, {"aux": {"ID": "sha256:98ea"}}]:
        progress.feed(event)
    assert progress.image_id == "sha256:98ea" and progress.error is None
    assert all(s.finished is not None for s in progress.steps)


def test_base_image_pull_is_reported_per_layer_state() -> None:
    recorder = Recorder()
    progress = BuildProgress(recorder)
    progress.feed({"stream": "Step 1/2 : FROM quay.io/ascend/cann:8.3.rc1-a3-ubuntu22.04-py3.11\n"})
    pull: list[dict[str, Any]] = [
        {"status": "Pulling from ascend/cann", "id": "8.3.rc1-a3-ubuntu22.04-py3.11"},
        {"status": "Pulling fs layer", "id": "a1"},
        {"status": "Downloading", "progressDetail": {"current": 1, "total": 9}, "id": "a1"},
        {"status": "Download complete", "id": "a1"},
        {"status": "Pull complete", "id": "a1"},
    ]
    for event in pull:
        progress.feed(event)
    assert [e for e in recorder.events if e.startswith("out")] == [
        "out 8.3.rc1-a3-ubuntu22.04-py3.11: Pulling from ascend/cann",
        "out a1: Pulling fs layer",
        "out a1: Download complete",
        "out a1: Pull complete",
    ]


def test_a_line_the_engine_sends_in_pieces_is_one_line() -> None:
    """The engine cuts output where its buffer fills (seen with uv's ' + markupsafe==2.0.1'): the
    pieces are joined, a piece left open is shown when the next builder line or the end comes."""
    recorder = Recorder()
    progress = BuildProgress(recorder)
    for event in [
        *STREAM[6:8],
        {"stream": "Installed 1 package in 8ms\n + marku"},
        {"stream": "psafe==2.0.1\n + six"},
        {"stream": "==1.16.0"},
        {"stream": " ---> 98ea4c035483\n"},
        {"stream": "Step 5/6 : RUN true\n"},
        {"stream": "no newline at the end"},
    ]:
        progress.feed(event)
    progress.close()
    outputs = [e for e in recorder.events if e.startswith("out ")]
    assert outputs == ["out Installed 1 package in 8ms", "out  + markupsafe==2.0.1", "out  + six==1.16.0", "out no newline at the end"]
    assert [s.number for s in progress.steps] == [4, 5]


def test_the_builders_stderr_colour_is_taken_out_even_mid_line() -> None:
    """The classic builder wraps each stderr chunk in ESC[91m ... ESC[0m: a line written in two pieces
    (uv's ' + ' and 'markupsafe==2.0.1') comes with the codes in its middle."""
    recorder = Recorder()
    progress = BuildProgress(recorder)
    for event in [*STREAM[6:8], {"stream": "\x1b[91m + \x1b[0m"}, {"stream": "\x1b[91mmarkupsafe==2.0.1\n\x1b[0m"}]:
        progress.feed(event)
    progress.close()
    assert [e for e in recorder.events if e.startswith("out ")] == ["out  + markupsafe==2.0.1"]
