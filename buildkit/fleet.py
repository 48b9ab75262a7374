"""``ascendkit build --all``: many images on one machine, going on past a failed one.

Each target is planned first (a refusal, such as a stale lock, is that target's outcome, not the
end of the run), then built in the order the plan gives (by arch, then stack: shared base layers
stay in the engine's cache), each verified and tagged as ``ascendkit build`` does; a failed
target is never tagged. The outcome of every target is kept for the summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docker

from buildkit.cancel import interrupted
from buildkit.errors import AscendkitError, Interrupted
from buildkit.image.build import run_build
from buildkit.image.buildplan import BuildPlan, BuildResult
from buildkit.image.progress import Reporter
from buildkit.plan import ImagePlan


@dataclass(frozen=True)
class TargetOutcome:
    name: str  # "stack chip os arch"
    result: str  # built, failed (the build, verification or push), refused (before building), interrupted, not started
    seconds: float
    size: int | None = None
    image_id: str | None = None
    digest: str | None = None  # of the pushed image, with --push
    exit_code: int = 0
    message: str = ""

    def describe(self) -> dict[str, Any]:
        return {
            "target": self.name,
            "result": self.result,
            "seconds": round(self.seconds, 1),
            "size": self.size,
            "image_id": self.image_id,
            "digest": self.digest,
            "exit_code": self.exit_code,
            "message": self.message,
        }


def target_name(plan: ImagePlan) -> str:
    return f"{plan.stack_id} {plan.chip_id} {plan.os_name} {plan.arch}"


def refused(plan: ImagePlan, error: AscendkitError) -> TargetOutcome:
    return TargetOutcome(target_name(plan), "refused", 0.0, exit_code=int(error.exit_code), message=str(error).splitlines()[0])


def build_each(
    client: docker.APIClient,
    builds: list[BuildPlan],
    reporter: Callable[[BuildPlan], Reporter],
    *,
    publish: Callable[[BuildResult, BuildPlan], str | None] | None = None,
    on_start: Callable[[int, BuildPlan], None] | None = None,
    on_error: Callable[[str, AscendkitError], None] | None = None,
) -> list[TargetOutcome]:
    """Build (and with ``publish``, push) every plan; a failure is recorded and the next one goes on.
    Ctrl-C or SIGTERM stops the whole run: the current build is cleaned up by ``run_build``, it is
    recorded as ``interrupted`` and the ones after it as ``not started``, and the outcomes so far
    are returned (the summary says what was built before the stop)."""
    outcomes: list[TargetOutcome] = []
    for index, plan in enumerate(builds):
        if on_start is not None:
            on_start(index, plan)
        started = time.monotonic()
        name = target_name(plan.image)
        try:
            result = run_build(client, plan, reporter(plan))
            digest = publish(result, plan) if publish is not None else None
        except (Interrupted, KeyboardInterrupt) as exc:
            stop = exc if isinstance(exc, Interrupted) else interrupted(exc, "the run was stopped")
            code, first = int(stop.exit_code), str(stop).splitlines()[0]
            outcomes.append(TargetOutcome(name, "interrupted", time.monotonic() - started, exit_code=code, message=first))
            outcomes += [TargetOutcome(target_name(p.image), "not started", 0.0, exit_code=code) for p in builds[index + 1 :]]
            break
        except AscendkitError as exc:
            if on_error is not None:
                on_error(name, exc)  # the whole message (the failing step's last lines), not only the summary's
            first = str(exc).splitlines()[0]
            outcomes.append(TargetOutcome(name, "failed", time.monotonic() - started, exit_code=int(exc.exit_code), message=first))
            continue
        size = client.inspect_image(result.engine_id or result.image_id).get("Size")
        outcomes.append(TargetOutcome(name, "built", time.monotonic() - started, size, result.image_id, digest, 0, result.refs[0]))
    return outcomes


def exit_code(outcomes: list[TargetOutcome]) -> int:
    """0 when every target was built; 130/143 when the run was stopped; otherwise the code of the
    first target that was not built."""
    stopped = [o.exit_code for o in outcomes if o.result == "interrupted"]
    return stopped[0] if stopped else next((o.exit_code for o in outcomes if o.result != "built"), 0)
