"""The job watcher: one progress line per step, and a stall that names its likely cause."""

from __future__ import annotations

from buildkit.run.jobwatch import JobWatch

RAY_UP = "2026-11-22 10:00:00,000 INFO worker.py:1888 -- Started a local Ray instance. View the dashboard at 127.0.0.1:8265"
PENDING_GPU = (
    "(autoscaler +1m2s) Warning: The following resource request cannot be scheduled right now: "
    "{'GPU': 1.0, 'CPU': 1.0}. This is likely due to all cluster resources being claimed by actors."
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_step_line_prints_one_progress_line_with_its_time() -> None:
    clock, seen = Clock(), list[str]()
    watch = JobWatch(steps=2, stall_after=60, progress=seen.append, clock=clock)
    watch.feed(RAY_UP)
    clock.now += 40
    watch.feed("(TaskRunner pid=7) step:1 - critic/rewards/mean:0.5 - timing_s/step:38.25")
    clock.now += 30
    watch.feed("\x1b[36m(TaskRunner pid=7)\x1b[0m step:2 - critic/rewards/mean:0.6")
    assert seen == ["step 1/2: 38.2 s by the job's log", "step 2/2: 30.0 s since the last progress"]
    clock.now += 10_000
    assert watch.stalled() is None, "every step done: nothing to wait for"


def test_no_step_after_ray_is_up_is_a_stall_pointing_at_the_device() -> None:
    clock = Clock()
    watch = JobWatch(steps=5, stall_after=600, clock=clock)
    clock.now += 5000
    assert watch.stalled() is None, "the clock starts when Ray is up (imports and model load may be slow)"
    watch.feed(RAY_UP)
    watch.feed(PENDING_GPU)
    clock.now += 599
    assert watch.stalled() is None
    clock.now += 2
    stall = watch.stalled()
    assert stall is not None
    assert stall.summary == "no step line for 601 s after Ray came up"
    assert "trainer.device is cuda" in stall.causes[0] and "GPU" in stall.causes[0]
    assert stall.last_lines[-1] == PENDING_GPU


def test_hccl_errors_point_at_the_network_and_a_quiet_log_says_so() -> None:
    clock = Clock()
    watch = JobWatch(steps=5, stall_after=60, clock=clock)
    watch.feed(RAY_UP)
    watch.feed("(TaskRunner pid=7) step:1 - timing_s/step:40.0")
    watch.feed("(WorkerDict pid=9) [ERROR] HCCL(1234): EI0006: Getting socket times out. Reason: remote rank did not connect")
    clock.now += 61
    stall = watch.stalled()
    assert stall is not None and stall.summary.endswith("after step 1")
    assert stall.causes[0].startswith("HCCL reported errors: the NPUs' network")
    quiet = JobWatch(steps=5, stall_after=60, clock=clock).diagnose()
    assert quiet.causes == ("Ray never reported that it started: the job is stuck before training (imports, model load, data)",)
