"""The smoke jobs: a job file of ``smoke_tests/`` filled in for one SKU and one image.

``ascendkit smoke`` and ``ascendkit k8s render`` both build the job here from the same inputs (the
SKU, the framework and release the image carries, the job, steps, nodes), so a Kubernetes run
gets exactly the arguments a local run does. Which file serves an image, and what is appended
to it, is the framework plug-in's to say (:mod:`buildkit.framework`), from facts in the matrix,
never from a per-stack list.
"""

from __future__ import annotations

import json
import shlex
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, StrictFloat, StrictInt, StrictStr, ValidationError

from buildkit.errors import Finding, InputError
from buildkit.framework import UNLABELLED, Framework, framework, frameworks
from buildkit.fsio import read_input_text
from buildkit.matrix.fields import Identifier
from buildkit.matrix.model import Compat, Frozen, Sku, Stack
from buildkit.matrix.yamlsource import YamlSourceError, format_path, load_yaml
from buildkit.resources import SMOKE_DIR
from buildkit.run import SmokeJob

JOBS: tuple[str, ...] = get_args(SmokeJob)

# Where the host's directories appear in the container.
SMOKE_FILES = "/opt/ascendkit-smoke"  # smoke_tests/, read-only (data generator, reward, argument check)
OUT_DIR = "/smoke/out"  # --out, writable: generated data
MODEL_DIR = "/smoke/model"  # --model-path, read-only
DATA_DIR = "/smoke/data"  # --data, read-only
DATA_FILES = ("train.parquet", "test.parquet")  # what --data must hold (every job reads both or the first)
GENERATED_DATA = f"{OUT_DIR}/data"
REWARD_FILE = f"{SMOKE_FILES}/gsm8k_reward.py"  # {reward}: the rule-based GSM8K reward (OpenRLHF's --remote_rm_url)
RAY_PORT = 6379

MIN_TRAIN_ROWS = 256  # what the generator writes by default; more when the steps need them


class RolloutSpec(Frozen):
    """What a job adds for the image's rollout engine (its io.ascendkit.rollout label)."""

    overrides: tuple[StrictStr, ...] = Field(min_length=1)
    env: dict[StrictStr, StrictStr] = Field(default={})


RolloutEngine = Literal["vllm", "sglang"]


class JobSpec(Frozen):
    """A job file of ``smoke_tests/``: the job, with placeholders the SKU and the options fill in."""

    framework: Identifier = Field(description="the framework plug-in whose job this is (buildkit/frameworks/<name>)")
    job: Literal["grpo", "sft"]
    module: StrictStr = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", description="run as python3 -m MODULE")
    launcher: tuple[StrictStr, ...] = Field(default=("python3",), min_length=1, description="what runs the module (torchrun ...)")
    nodes: Literal["any", "one"] = "any"
    ray_head: bool = Field(default=False, description="start a Ray head in the container first (one node)")
    data: Literal["verl-rl", "verl-sft", "openrlhf-rl"]
    tensor_parallel: StrictInt = Field(default=1, gt=0)
    prompts_per_npu: StrictInt = Field(gt=0)
    samples_per_prompt: StrictInt = Field(default=1, gt=0)
    actor_share: StrictFloat | None = Field(
        default=None, gt=0, lt=1, description="the share of each node's NPUs for the actor (and reference), the rest for rollout engines"
    )
    env: dict[StrictStr, StrictStr] = Field(default={})
    overrides: tuple[StrictStr, ...] = ()
    rollouts: dict[RolloutEngine, RolloutSpec] = Field(
        default={}, description="per rollout engine: the overrides and environment that select and configure it"
    )


PLACEHOLDERS = (
    "npus",
    "nnodes",
    "tp",
    "batch",
    "steps",
    "model",
    "data",
    "actor_npus",
    "engines",
    "samples",
    "train_batch",
    "max_samples",
    "reward",
)


def load_job(path: Path) -> JobSpec:
    """Read and check a job file; errors name the file, line and field."""
    text = read_input_text(path, "smoke job file")
    try:
        data, source, syntax = load_yaml(text, path)
    except YamlSourceError as exc:
        raise InputError("\n".join(f.format() for f in exc.findings)) from None
    findings = list(syntax)
    try:
        job = JobSpec.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if p != "[key]")
            findings.append(Finding(source.locate(loc), format_path(loc), err["msg"]))
        raise InputError("\n".join(f.format() for f in findings)) from None
    fields: list[tuple[tuple[str, ...], tuple[str, ...]]] = [(("overrides",), job.overrides), (("launcher",), job.launcher)]
    fields += [(("rollouts", engine, "overrides"), spec.overrides) for engine, spec in job.rollouts.items()]
    for field_path, items in fields:
        for index, item in enumerate(items):
            for _, name, _, _ in string.Formatter().parse(item):
                if name is not None and name not in PLACEHOLDERS:
                    loc = (*field_path, index)
                    findings.append(
                        Finding(source.locate(loc), format_path(loc), f"unknown placeholder {{{name}}}", hint=", ".join(PLACEHOLDERS))
                    )
    plugin = frameworks().get(job.framework)
    if plugin is None:
        known = ", ".join(frameworks())
        findings.append(Finding(source.locate(("framework",)), "framework", f"no framework {job.framework!r}", hint=known))
    elif plugin.splits_nodes and job.actor_share is None:
        findings.append(Finding(source.locate(()), "actor_share", f"an {plugin.title} job splits each node's NPUs: give actor_share"))
    if findings:
        raise InputError("\n".join(f.format() for f in findings))
    return job


@dataclass(frozen=True)
class JobFacts:
    """What the matrix knows of the frameworks' entry points (``compat``): which file and what to append."""

    compat: Compat

    @classmethod
    def of(cls, compat: Compat) -> JobFacts:
        return cls(compat)


@dataclass(frozen=True)
class ImageJob:
    """What of the image decides the job's arguments, as its labels (or ``--stack``) tell."""

    stack: str | None
    version: str | None  # the framework's release installed in the image; None when not known
    framework: str = UNLABELLED
    rollout: str = "vllm"  # the engine the job rolls out with (images without the label carry vLLM)

    @classmethod
    def of(cls, stack_id: str, stack: Stack) -> ImageJob:
        """What an image of this stack of the matrix carries."""
        return cls(stack_id, stack.framework_version, stack.framework, stack.rollout)


def _plugin(image: ImageJob) -> Framework:
    """The image's framework; one no plug-in knows has no smoke job."""
    if image.framework not in frameworks():
        raise InputError(f"{image.framework!r} images have no smoke job; frameworks: {', '.join(frameworks())}")
    return framework(image.framework)


def job_file(image: ImageJob, job: str, facts: JobFacts) -> Path:
    """The job file that serves ``job`` in this image (refused when its framework has none)."""
    if job not in JOBS:
        raise InputError(f"--job {job!r}: one of {', '.join(JOBS)}")
    plugin = _plugin(image)
    if job not in plugin.jobs:
        others = [f.title for f in frameworks().values() if job in f.jobs]
        raise InputError(
            f"--job {job}: {'an' if plugin.title[0] in 'AEIOUaeiou' else 'a'} {plugin.title} image has the "
            f"{' and '.join(plugin.jobs)} smoke job" + (f" ({job.upper()} smoke jobs are {', '.join(others)}'s)" if others else "")
        )
    return SMOKE_DIR / plugin.job_file(job, image.version, facts.compat)


def spec_for(image: ImageJob, job: str, facts: JobFacts) -> JobSpec:
    spec = load_job(job_file(image, job, facts))
    if spec.framework != image.framework or spec.job != job:  # a job file that says it is another
        raise InputError(f"{job_file(image, job, facts)}: a {spec.framework} {spec.job} job, not {image.framework} {job}")
    return spec


def check_overrides(items: list[str], framework_name: str | None = None) -> tuple[str, ...]:
    """``--override`` values, each one argument of the image's framework (its plug-in says which
    form: Hydra's KEY=VALUE, or a flag ``--name[=value]``). With no framework (the image not read
    yet), any plug-in's form."""
    plugins = list(frameworks().values()) if framework_name is None else [framework(framework_name)]
    for item in items:
        errors = [e for plugin in plugins if (e := plugin.override_error(item)) is not None]
        if len(errors) == len(plugins):
            if framework_name is not None:
                raise InputError(f"--override {item!r}: {errors[0]}")
            forms = {"hydra": "a Hydra override KEY=VALUE", "flags": "a flag --name[=value]"}
            said = " or ".join(f"{forms[p.arguments]} ({p.title})" for p in plugins)
            raise InputError(f"--override {item!r}: {said}")
    return tuple(items)


@dataclass(frozen=True)
class Job:
    """The job as it runs: the training command, its environment and the data it needs."""

    framework: str
    name: str  # grpo or sft
    launcher: tuple[str, ...]
    module: str
    overrides: tuple[str, ...]  # in the framework's form (Hydra overrides, or flags), the user's last
    env: dict[str, str]
    batch: int
    steps: int
    train_rows: int
    appended: tuple[str, ...]  # what the framework added for the image's release (verl: trainer.device=npu)
    data_format: str = "verl-rl"
    nnodes: int = 1
    ray_npus: int = 0  # > 0: start a Ray head with this many NPUs as Ray's NPU resource first

    @property
    def command(self) -> tuple[str, ...]:
        """The entry point: ``python3 -m verl.trainer.main_ppo``, ``torchrun ... -m ...``."""
        return (*self.launcher, "-m", self.module)

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.overrides]

    @property
    def check_style(self) -> str:
        """How the config check runs: ``hydra`` (Hydra composes with ``--cfg job``) or ``parser`` (the framework's own)."""
        return framework(self.framework).check_style

    def check_argv(self) -> list[str]:
        """The same module and arguments, run only as far as the framework's own checks go: Hydra
        composes the config (``--cfg job``) and exits; a parser parses and asserts up to ``ray.init``."""
        return framework(self.framework).check_argv(self.module, self.overrides)

    def data_command(self) -> list[str]:
        """Generate the job's gsm8k-format data in the container: enough rows for every step."""
        return [
            "python3",
            f"{SMOKE_FILES}/gsm8k_synth.py",
            "--out",
            GENERATED_DATA,
            "--train",
            str(self.train_rows),
            "--format",
            self.data_format,
        ]

    def ray_head_command(self) -> list[str]:
        """``ray start --head`` with the node's NPUs declared, as the seed starts Ray in the container."""
        return [
            "ray",
            "start",
            "--head",
            f"--port={RAY_PORT}",
            "--disable-usage-stats",
            f"--resources={json.dumps({'NPU': self.ray_npus})}",
        ]

    def shell(self, *, generate_data: bool) -> str:
        steps = [shlex.join(self.data_command())] if generate_data else []
        if self.ray_npus:
            steps.append(shlex.join(self.ray_head_command()))
        return "set -e; " + "; ".join([*steps, "exec " + shlex.join(self.argv)])


def _split(spec: JobSpec, npus: int, nnodes: int) -> dict[str, str]:
    """The batch, and where the job splits each node's NPUs between the actor and its rollout engines."""
    if spec.actor_share is None:
        if npus % spec.tensor_parallel:
            raise InputError(f"tensor_parallel {spec.tensor_parallel} does not divide the SKU's {npus} NPUs per node")
        return {"batch": str(spec.prompts_per_npu * npus * nnodes)}
    actor_npus = round(npus * spec.actor_share)  # actor (and ref) on a share of each node, rollout engines on the rest
    rollout_npus = npus - actor_npus
    if actor_npus < 1 or rollout_npus < 1 or rollout_npus % spec.tensor_parallel:
        raise InputError(
            f"actor_share {spec.actor_share} of {npus} NPUs leaves {rollout_npus} for rollout engines of tensor_parallel "
            f"{spec.tensor_parallel}: each node needs NPUs for both, the engines' a multiple of their TP"
        )
    return {
        "batch": str(spec.prompts_per_npu * actor_npus * nnodes),
        "actor_npus": str(actor_npus),
        "engines": str(rollout_npus * nnodes // spec.tensor_parallel),
    }


def build_job(
    spec: JobSpec,
    sku: Sku,
    image: ImageJob,
    *,
    facts: JobFacts,
    steps: int,
    nnodes: int = 1,
    model: str = MODEL_DIR,
    data: str = GENERATED_DATA,
    reward: str = REWARD_FILE,
    extra: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> Job:
    """Fill the job for the SKU and the image: the placeholders, what the framework appends for the
    image's release (verl: the device override), then the user's ``--override`` values."""
    if spec.nodes == "one" and nnodes != 1:
        raise InputError(
            f"the {spec.framework} {spec.job} job runs on one node ({shlex.join(spec.launcher)}); --nodes {nnodes} is for GRPO"
        )
    npus = sku.npus_per_node
    fill = {"npus": str(npus), "nnodes": str(nnodes), "tp": str(spec.tensor_parallel), "steps": str(steps), "model": model, "data": data}
    fill["reward"] = reward
    fill.update(_split(spec, npus, nnodes))
    batch = int(fill["batch"])
    fill.update(samples=str(spec.samples_per_prompt), train_batch=str(batch * spec.samples_per_prompt), max_samples=str(batch * steps))
    appended = framework(spec.framework).job_overrides(spec.job, image.version, facts.compat)
    env = dict(spec.env)
    overrides = [o.format_map(fill) for o in spec.overrides]
    if spec.rollouts:
        engine = spec.rollouts.get(image.rollout)  # type: ignore[call-overload]
        if engine is None:
            raise InputError(f"the {spec.framework} {spec.job} job has no settings for the {image.rollout} rollout of this image")
        overrides += [o.format_map(fill) for o in engine.overrides]
        env.update(engine.env)
    overrides += appended
    return Job(
        framework=spec.framework,
        name=spec.job,
        launcher=tuple(item.format_map(fill) for item in spec.launcher),
        module=spec.module,
        overrides=(*overrides, *extra),
        env={**env, **(extra_env or {})},
        batch=batch,
        steps=steps,
        # One epoch of train rows must hold every step's batch (the trainers drop a last partial batch).
        train_rows=max(MIN_TRAIN_ROWS, batch * steps),
        appended=appended,
        data_format=spec.data,
        nnodes=nnodes,
        ray_npus=npus if spec.ray_head and nnodes == 1 else 0,
    )
