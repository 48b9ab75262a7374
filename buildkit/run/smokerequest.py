"""The one place a smoke run is asked for: what `ascendkit smoke` and :func:`buildkit.api.smoke`
both build, from the same options, with the same refusals, before any engine is contacted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from buildkit.errors import InputError
from buildkit.matrix.load import LoadedMatrix, resolve_sku
from buildkit.run import MAX_SECONDS, MAX_STEPS
from buildkit.run.smoke import SmokeRequest, check_request


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
    steps: int = 5,
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

    sku_id, sku, chip_id = resolve_sku(loaded, hw, "smoke needs the SKU (its NPU count)")
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
        baseline=load_run(baseline) if baseline else None,
        baseline_name=baseline.name if baseline else None,
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
