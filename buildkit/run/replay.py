"""Both sides of a deterministic replay, composed from the one GRPO job file: the GPU run that dumps its rollouts
and the NPU run that replays them (the framework plug-in says each release's keys: :meth:`Framework.replay`).

The two runs must agree on every name verl builds the dump's location from (experiment, project, the batch, ``n``,
the prompt and response lengths), so both are built from the same job file for the same NPU SKU: the GPU run takes
the NPU run's batch and changes only what the machine decides (its devices per node, ``trainer.device``) and the
deterministic environment. A batch the GPU count cannot split is refused before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from buildkit.errors import InputError
from buildkit.framework import framework
from buildkit.matrix.model import Sku
from buildkit.run.job import GENERATED_DATA, MODEL_DIR, ImageJob, Job, JobFacts, build_job, spec_for

# The Hydra keys verl builds a dump's location from, in every release that replays (the names of the bundle).
NAME_KEYS = {
    "experiment": "trainer.experiment_name",
    "project": "trainer.project_name",
    "batch": "data.train_batch_size",
    "n": "actor_rollout_ref.rollout.n",
    "max_prompt_length": "data.max_prompt_length",
    "max_response_length": "data.max_response_length",
}
GEN_BATCH = "data.gen_batch_size"  # used instead of the train batch where a job sets it
DUMP_DIR = "/smoke/replay"  # where both runs see the dump directory in a container (the NPU's mount is read-only)


def override_values(overrides: tuple[str, ...]) -> dict[str, str]:
    """KEY=VALUE overrides as verl's Hydra takes them (a ``+`` or ``++`` prefix adds a key; the last one counts)."""
    values: dict[str, str] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep:
            values[key.lstrip("+~")] = value
    return values


def dump_names(job: Job) -> dict[str, str]:
    """The names a run's dump location is built from, as the job sets them."""
    values = override_values(job.overrides)
    names = {name: values.get(key, "") for name, key in NAME_KEYS.items()}
    if values.get(GEN_BATCH):
        names["batch"] = values[GEN_BATCH]
    return names


def differing_names(expected: dict[str, str], got: dict[str, str]) -> list[str]:
    """Each name the two runs do not share, in words: why a replay would find nothing."""
    return [
        f"{name} ({NAME_KEYS[name]}): the baseline's {expected.get(name)!r}, this run's {got.get(name)!r}"
        for name in NAME_KEYS
        if expected.get(name) != got.get(name)
    ]


def _replaced(overrides: tuple[str, ...], changes: dict[str, str]) -> tuple[str, ...]:
    """The overrides with ``changes`` applied in place (Hydra refuses one key given twice), the new ones appended."""
    out, seen = [], set()
    for item in overrides:
        key = item.partition("=")[0]
        if key in changes:
            out.append(f"{key}={changes[key]}")
            seen.add(key)
        else:
            out.append(item)
    return (*out, *(f"{k}={v}" for k, v in changes.items() if k not in seen))


@dataclass(frozen=True)
class ReplaySides:
    gpu: Job
    npu: Job
    gpus: int
    steps: int


def compose_replay(
    sku: Sku,
    image: ImageJob,
    *,
    facts: JobFacts,
    gpus: int,
    steps: int | None,
    expansion_mode: str | None = None,
    model: str = MODEL_DIR,
    data: str = GENERATED_DATA,
    dump_dir: str = DUMP_DIR,
) -> ReplaySides:
    """The GPU run (on ``gpus`` devices per node) and the NPU run (on ``sku``) of one replay of the GRPO job."""
    replay = framework(image.framework).replay(image.version)  # refused, with the reason, where it cannot replay
    steps = replay.steps(steps)
    spec = spec_for(image, "grpo", facts)
    npu = build_job(spec, sku, image, facts=facts, steps=steps, model=model, data=data)
    keys = replay.overrides(steps, dump_dir)
    npu = replace(npu, overrides=(*npu.overrides, *keys), env={**npu.env, **replay.env("npu", expansion_mode)})
    if gpus < 1 or gpus % spec.tensor_parallel:
        raise InputError(f"--gpus {gpus}: the job's rollout tensor parallelism {spec.tensor_parallel} must divide it")
    samples = npu.batch * spec.samples_per_prompt
    if samples % gpus or npu.batch % gpus:
        raise InputError(
            f"--gpus {gpus}: the NPU run's batch ({npu.batch} prompts, {samples} samples on {sku.npus_per_node} NPUs) does not split "
            f"over {gpus} GPUs, and both runs must share it (the dump's name carries it): use a GPU count that divides {npu.batch}"
        )
    changes = {"trainer.n_gpus_per_node": str(gpus)}
    if any(o.startswith("trainer.device=") for o in npu.overrides):
        changes["trainer.device"] = "cuda"
    # The rollout engine's Ascend settings (SGLang's ascend attention backend, HCCL port ranges) stay on the NPU;
    # the GPU run keeps only which engine it is.
    engine = spec.rollouts.get(image.rollout)  # type: ignore[call-overload]
    ascend_only = {o for o in (engine.overrides if engine is not None else ()) if not o.startswith("actor_rollout_ref.rollout.name=")}
    gpu = replace(
        npu,
        overrides=_replaced(tuple(o for o in npu.overrides if o not in ascend_only), changes),
        env={**spec.env, **replay.env("gpu", None)},
        appended=tuple(o for o in npu.appended if not o.startswith("trainer.device=")),
        ray_npus=0,
    )
    return ReplaySides(gpu=gpu, npu=npu, gpus=gpus, steps=steps)
