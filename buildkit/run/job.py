"""The GRPO smoke job: ``smoke_tests/grpo_smoke.yaml`` filled in for one SKU and one image.

``ascendkit smoke`` and ``ascendkit k8s render --job smoke`` both build the job here from the same
inputs (the SKU, the verl release the image carries, steps, nodes), so a Kubernetes run gets
exactly the arguments a local run does. What depends on the image follows from facts in the
matrix, never from a per-stack list: an image whose verl predates NPU auto-detection
(``compat.verl_npu_autodetect``) gets ``trainer.device=npu``.
"""

from __future__ import annotations

import shlex
import string
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version
from pydantic import Field, StrictInt, StrictStr, ValidationError

from buildkit.errors import Finding, InputError
from buildkit.fsio import read_input_text
from buildkit.matrix.model import Frozen, Sku
from buildkit.matrix.yamlsource import YamlSourceError, format_path, load_yaml
from buildkit.resources import SMOKE_DIR

JOB_FILE = SMOKE_DIR / "grpo_smoke.yaml"

# Where the host's directories appear in the container.
SMOKE_FILES = "/opt/ascendkit-smoke"  # smoke_tests/, read-only (the data generator)
OUT_DIR = "/smoke/out"  # --out, writable: generated data
MODEL_DIR = "/smoke/model"  # --model-path, read-only
DATA_DIR = "/smoke/data"  # --data, read-only
DATA_FILES = ("train.parquet", "test.parquet")  # what --data must hold (smoke_tests/grpo_smoke.yaml reads both)
GENERATED_DATA = f"{OUT_DIR}/data"

DEVICE_OVERRIDE = "trainer.device=npu"
MIN_TRAIN_ROWS = 256  # what the generator writes by default; more when the steps need them


class JobSpec(Frozen):
    """``smoke_tests/grpo_smoke.yaml``: the job, with placeholders the SKU fills in."""

    command: tuple[StrictStr, ...] = Field(min_length=1)
    tensor_parallel: StrictInt = Field(gt=0)
    prompts_per_npu: StrictInt = Field(gt=0)
    env: dict[StrictStr, StrictStr] = Field(default={})
    overrides: tuple[StrictStr, ...] = ()


PLACEHOLDERS = ("npus", "nnodes", "tp", "batch", "steps", "model", "data")


def load_job(path: Path = JOB_FILE) -> JobSpec:
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
    for index, item in enumerate(job.overrides):
        for _, name, _, _ in string.Formatter().parse(item):
            if name is not None and name not in PLACEHOLDERS:
                loc = ("overrides", index)
                findings.append(
                    Finding(source.locate(loc), format_path(loc), f"unknown placeholder {{{name}}}", hint=", ".join(PLACEHOLDERS))
                )
    if findings:
        raise InputError("\n".join(f.format() for f in findings))
    return job


def check_overrides(items: list[str]) -> tuple[str, ...]:
    """``--override`` values: Hydra overrides are KEY=VALUE (``+KEY=VALUE`` adds a key)."""
    for item in items:
        if "=" not in item:
            raise InputError(f"--override {item!r}: expected a Hydra override KEY=VALUE")
    return tuple(items)


def needs_device_override(verl: str | None, first_autodetect: str) -> bool:
    """True unless the image's verl switches ``trainer.device`` to npu by itself.

    An unknown or unparsable verl release gets the override: ``trainer.device=npu`` is what
    auto-detection would choose anyway, so passing it is never wrong on an Ascend node.
    """
    if verl is None:
        return True
    try:
        return Version(verl) < Version(first_autodetect)
    except InvalidVersion:
        return True


@dataclass(frozen=True)
class ImageJob:
    """What of the image decides the job's arguments, as its labels (or ``--stack``) tell."""

    stack: str | None
    verl: str | None  # the verl release installed in the image; None when not known


@dataclass(frozen=True)
class Job:
    """The job as it runs: the training command, its environment and the data it needs."""

    command: tuple[str, ...]  # the entry point: python3 -m verl.trainer.main_ppo
    overrides: tuple[str, ...]  # Hydra overrides, the user's last
    env: dict[str, str]
    batch: int
    steps: int
    train_rows: int
    device_override: bool

    def data_command(self) -> list[str]:
        """Generate the gsm8k-format data in the container: enough rows for every step."""
        return ["python3", f"{SMOKE_FILES}/gsm8k_synth.py", "--out", GENERATED_DATA, "--train", str(self.train_rows)]

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.overrides]

    def check_argv(self) -> list[str]:
        """The same command with Hydra's ``--cfg job``: verl composes its config, prints it and exits."""
        return [*self.command, "--cfg", "job", *self.overrides]

    def shell(self, *, generate_data: bool) -> str:
        steps = [shlex.join(self.data_command())] if generate_data else []
        return "set -e; " + "; ".join([*steps, "exec " + shlex.join(self.argv)])


def build_job(
    spec: JobSpec,
    sku: Sku,
    image: ImageJob,
    *,
    first_autodetect: str,
    steps: int,
    nnodes: int = 1,
    model: str = MODEL_DIR,
    data: str = GENERATED_DATA,
    extra: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> Job:
    """Fill the job for the SKU and the image: the entry, the filled overrides, the device
    override when the image's verl needs it, then the user's ``--override`` values."""
    if sku.npus_per_node % spec.tensor_parallel:
        raise InputError(f"tensor_parallel {spec.tensor_parallel} does not divide the SKU's {sku.npus_per_node} NPUs per node")
    batch = spec.prompts_per_npu * sku.npus_per_node * nnodes
    fill = {
        "npus": str(sku.npus_per_node),
        "nnodes": str(nnodes),
        "tp": str(spec.tensor_parallel),
        "batch": str(batch),
        "steps": str(steps),
        "model": model,
        "data": data,
    }
    device = needs_device_override(image.verl, first_autodetect)
    overrides = [o.format_map(fill) for o in spec.overrides]
    if device:
        overrides.append(DEVICE_OVERRIDE)
    return Job(
        command=spec.command,
        overrides=(*overrides, *extra),
        env={**spec.env, **(extra_env or {})},
        batch=batch,
        steps=steps,
        # One epoch of train rows must hold every step's batch (verl drops the last partial batch).
        train_rows=max(MIN_TRAIN_ROWS, batch * steps),
        device_override=device,
    )
