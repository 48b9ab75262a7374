"""``smoke --baseline BUNDLE``: the NPU side of a deterministic replay (:mod:`buildkit.run.replaybundle`).

Before anything runs, the NPU job is composed as the GPU run was (:func:`buildkit.run.replay.compose_replay`, for the
bundle's GPU count and steps) and every name verl builds the dump's location from is held to the bundle's: a name
that differs is refused, naming it, because verl would find no dump and silently generate its own rollouts. The
dump is mounted read-only where the job looks for it, the bundle's data is the data, the chip's deterministic
environment is set. Afterwards, verl's own lines prove the run replayed rather than generated, and the run is judged
by the replay method (:mod:`buildkit.accuracy.methods`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from buildkit.accuracy.methods import Verdict, judge_replay
from buildkit.accuracy.metrics import StepMetrics
from buildkit.doctor.base import Check
from buildkit.errors import InputError
from buildkit.framework import framework
from buildkit.matrix.model import Sku
from buildkit.run.job import DATA_DIR, ImageJob, Job, JobFacts, check_overrides
from buildkit.run.replay import DUMP_DIR, compose_replay, differing_names, dump_names
from buildkit.run.replaybundle import Bundle, is_bundle, load_bundle, model_mismatch


def bundle_of(baseline: Path | None) -> Bundle | None:
    """The replay bundle ``--baseline`` names, checked against its manifest; None for a log or baseline file."""
    if baseline is not None and baseline.is_dir() and not is_bundle(baseline):
        raise InputError(f"--baseline {baseline}: a directory but not a replay bundle (no replay.json; `baseline replay` writes one)")
    return load_bundle(baseline) if baseline is not None and is_bundle(baseline) else None


def check_bundle_request(bundle: Bundle, *, job: str, steps: int | None, data_path: Path | None, model_path: Path | None) -> int:
    """What a replay fixes of the request: the GRPO job, the bundle's steps and data, the GPU run's weights."""
    plan = bundle.plan
    if job != "grpo":
        raise InputError(f"--baseline {bundle.root}: a replay bundle replays the GRPO job, not --job {job}")
    if steps is not None and steps != plan.steps:
        raise InputError(f"--steps {steps}: the bundle's GPU run dumped {plan.steps} step(s); a replay runs those (leave --steps out)")
    if data_path is not None:
        raise InputError(f"--data: a replay trains on the data the GPU run trained on ({bundle.data}); leave --data out")
    if model_path is not None and (why := model_mismatch(bundle, model_path)) is not None:
        raise InputError(why)
    return plan.steps


def replay_job(
    bundle: Bundle, sku: Sku, image: ImageJob, facts: JobFacts, expansion_mode: str | None, extra: tuple[str, ...], env: dict[str, str]
) -> Job:
    """The NPU run of the bundle's replay in this image, refused (naming what differs) where it would not replay."""
    plan = bundle.plan
    if (image.framework, image.version) != (plan.framework, plan.version):
        raise InputError(
            f"the bundle was made by {plan.framework} {plan.version}; this image carries {image.framework} {image.version or '(unknown)'}: "
            "the replay keys and the dump's layout are the release's own"
        )
    sides = compose_replay(sku, image, facts=facts, gpus=plan.gpus, steps=plan.steps, expansion_mode=expansion_mode, data=DATA_DIR)
    job = replace(sides.npu, overrides=(*sides.npu.overrides, *check_overrides(list(extra), image.framework)), env={**sides.npu.env, **env})
    differ = differing_names(plan.names, dump_names(job))
    if differ:
        raise InputError("this run would not replay the bundle (verl would find no dump and generate its own): " + "; ".join(differ))
    return job


def replay_mounts(bundle: Bundle) -> dict[str, tuple[str, str]]:
    """The dump where the job reads it and the data it trains on, both read-only."""
    return {str(bundle.dump.resolve()): (DUMP_DIR, "ro"), str(bundle.data.resolve()): (DATA_DIR, "ro")}


def judge_replay_run(bundle: Bundle, image: ImageJob, lines: list[str], steps: list[StepMetrics]) -> tuple[list[Check], Verdict | None]:
    """Whether the run replayed (verl's own lines), and the replay method's verdict against the GPU run."""
    found = framework(image.framework).replay(image.version).evidence(lines)
    why = found.verdict(bundle.plan.steps)
    detail = why or f"verl read the GPU run's rollouts at {len(found.loaded)} step(s) and generated none"
    checks = [Check("replay", "error" if why else "ok", detail)]
    if not steps:
        return checks, None
    try:
        verdict = judge_replay(steps, bundle.steps)
    except InputError as exc:
        return [*checks, Check("replay gate", "error", str(exc))], None
    return [*checks, *(r.check for r in verdict.results)], verdict


def replay_note(bundle: Bundle | None, image: ImageJob) -> str:
    """For the report: what this run replayed, or whether the image's framework could replay a GPU run at all."""
    if bundle is not None:
        return f"replaying {bundle.root.name} ({bundle.plan.framework} {bundle.plan.version}, {bundle.plan.steps} step(s))"
    try:
        framework(image.framework).replay(image.version)
    except InputError as exc:
        return f"not available: {exc}"
    return "available: `ascendkit baseline replay` makes the GPU side, `smoke --baseline BUNDLE` replays it"
