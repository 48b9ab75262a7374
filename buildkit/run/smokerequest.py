"""The one place a smoke run is asked for: what `ascendkit smoke` and :func:`buildkit.api.smoke`
both build, from the same options, with the same refusals, before any engine is contacted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from buildkit.accuracy.metrics import StepMetrics
from buildkit.errors import InputError
from buildkit.fsio import check_output_dir
from buildkit.imageref import IMAGE_REFERENCE
from buildkit.matrix.load import LoadedMatrix, resolve_sku
from buildkit.matrix.model import Sku
from buildkit.run import MAX_SECONDS, MAX_STEPS
from buildkit.run.devices import DevicePlan, plan_devices
from buildkit.run.job import DATA_FILES, JobFacts
from buildkit.run.replaybundle import Bundle


@dataclass
class SmokeRequest:
    sku_id: str
    sku: Sku
    chip_id: str
    image: str
    out: Path
    steps: int = 5
    timeout: float = 1800.0
    model_path: Path | None = None
    data_path: Path | None = None
    baseline: list[StepMetrics] | None = None
    baseline_name: str | None = None
    replay: Bundle | None = None  # --baseline BUNDLE: the GPU run this one replays
    visible: list[int] | None = None
    privileged: bool = False
    as_root: bool = False  # --as-root: every container as root instead of the image's user
    overrides: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    host_root: Path = Path("/")
    facts: JobFacts = field(kw_only=True)  # what the matrix knows of the frameworks' entry points
    job: str = "grpo"  # --job: grpo, or verl's sft
    check_only: bool = False  # --check: the config check alone, on any host
    config_check: bool = True  # --no-config-check: for images without the framework (the CI test stack)
    stall_after: float = 900.0  # seconds without a step line once Ray is up
    progress: Callable[[str], None] | None = None


PARQUET_MAGIC = b"PAR1"


def check_data_dir(path: Path) -> None:
    """``--data`` must hold the two parquet files the job reads (smoke_tests/grpo_smoke.yaml)."""
    if not path.is_dir():
        raise InputError(f"--data {path}: not a directory (one holding train.parquet and test.parquet)")
    for name in DATA_FILES:
        file = path / name
        if not file.is_file():
            raise InputError(
                f"--data {path}: no {name} in it (the job reads train.parquet and test.parquet; leave --data out to generate them)"
            )
        try:
            with file.open("rb") as handle:
                magic = handle.read(len(PARQUET_MAGIC))
        except OSError as exc:
            raise InputError(f"--data {file}: cannot read: {exc.strerror}") from None
        if magic != PARQUET_MAGIC:
            raise InputError(f"--data {file}: not a parquet file (it does not start with PAR1)")


def check_visible(visible: list[int], sku_id: str, sku: Sku) -> None:
    """``--devices`` must name NPUs the SKU has: ids 0 to npus_per_node - 1."""
    beyond = [i for i in visible if i >= sku.npus_per_node]
    if beyond:
        raise InputError(
            f"--devices: {sku_id} has {sku.npus_per_node} NPUs per node (ids 0-{sku.npus_per_node - 1}); {beyond[0]} is not one of them"
        )


def check_request(request: SmokeRequest) -> DevicePlan:
    """Everything about a request that needs no engine, so a mistake is exit 2 (or 3) before the
    engine is contacted: the options, the paths, the report directory and the host's devices."""
    if request.check_only and not request.config_check:
        raise InputError("--check and --no-config-check exclude each other")
    if not IMAGE_REFERENCE.match(request.image):
        raise InputError(f"--image {request.image!r} is not an image reference: NAME[:TAG] or NAME@sha256:<64 hex>")
    if request.model_path is not None and not request.model_path.is_dir():
        raise InputError(f"--model-path {request.model_path}: not a directory (a local Qwen2.5-0.5B-Instruct)")
    if request.data_path is not None:
        check_data_dir(request.data_path)
    if request.visible is not None:
        check_visible(request.visible, request.sku_id, request.sku)
    check_output_dir(request.out, "report directory (--out)")
    if request.check_only:
        devices = DevicePlan((), (), (), notes=("--check: the config check only, no devices used",))
    else:
        devices = plan_devices(request.sku_id, request.sku, request.visible, request.host_root)
    if devices.has_npus and request.model_path is None:
        raise InputError("--model-path is required on a host with NPUs (a local Qwen2.5-0.5B-Instruct; docs/smoke.md)")
    return devices


def pairs(items: Sequence[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a mapping; anything else is refused naming ``option``."""
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"{option} {item!r}: expected KEY=VALUE")
        result[key] = value
    return result


def local_image(loaded: LoadedMatrix, sku_id: str, stack: str | None) -> str:
    """What `ascendkit build --hw SKU [--stack S]` tagged on this machine."""
    from buildkit.image.buildplan import host_arch
    from buildkit.plan import plan_image, plan_target
    from buildkit.resources import default_repository

    plan = plan_image(loaded, plan_target(loaded, sku_id, stack, None), host_arch())
    return f"{default_repository(plan.framework)}:{plan.tags[0]}"


def make_request(
    loaded: LoadedMatrix,
    hw: str,
    out: Path,
    *,
    image: str | None = None,
    stack: str | None = None,
    job: str = "grpo",
    steps: int | None = None,
    timeout: float = 1800.0,
    stall_timeout: float = 900.0,
    model_path: Path | None = None,
    data_path: Path | None = None,
    baseline: Path | None = None,
    devices: str | None = None,
    privileged: bool = False,
    as_root: bool = False,
    overrides: Sequence[str] = (),
    env: Sequence[str] = (),
    check_only: bool = False,
    config_check: bool = True,
    progress: Callable[[str], None] | None = None,
) -> SmokeRequest:
    """A checked smoke request: the SKU resolved, the image named (``image``, else the local build
    of ``stack``), every option within its bounds, the paths, devices and report directory looked at.
    A mistake is :class:`InputError` (exit 2) before anything is run."""
    from buildkit.accuracy.compare import load_run
    from buildkit.run.devices import parse_visible
    from buildkit.run.job import JobFacts, check_overrides
    from buildkit.run.smokereplay import bundle_of, check_bundle_request

    sku_id, sku, chip_id = resolve_sku(loaded, hw, "smoke needs the SKU (its NPU count)")
    bundle = bundle_of(baseline)  # a replay bundle fixes the job, the steps and the data
    if bundle is not None:
        steps = check_bundle_request(bundle, job=job, steps=steps, data_path=data_path, model_path=model_path)
        data_path = bundle.data
    steps = 5 if steps is None else steps
    if not 1 <= steps <= MAX_STEPS:
        raise InputError(f"--steps {steps}: from 1 to {MAX_STEPS}")
    for value, option in ((timeout, "--timeout"), (stall_timeout, "--stall-timeout")):
        if not 1 <= value <= MAX_SECONDS:  # also refuses nan
            raise InputError(f"{option} {value}: from 1 to {MAX_SECONDS} seconds")
    if image is not None and stack is not None:
        raise InputError("--image and --stack exclude each other: the image's labels name its stack")
    request = SmokeRequest(
        sku_id=sku_id,
        sku=sku,
        chip_id=chip_id,
        image=image if image is not None else local_image(loaded, sku_id, stack),
        out=out,
        steps=steps,
        timeout=timeout,
        model_path=model_path,
        data_path=data_path,
        baseline=bundle.steps if bundle is not None else load_run(baseline) if baseline else None,
        baseline_name=f"{baseline.name} (replay bundle)" if bundle is not None and baseline else baseline.name if baseline else None,
        replay=bundle,
        visible=parse_visible(devices) if devices is not None else None,
        privileged=privileged,
        as_root=as_root,
        overrides=check_overrides(list(overrides)),
        env=pairs(env, "--env"),
        facts=JobFacts.of(loaded.matrix.compat),
        job=job,
        check_only=check_only,
        config_check=config_check,
        stall_after=stall_timeout,
        progress=progress,
    )
    check_request(request)
    return request
