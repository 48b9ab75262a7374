"""The library API: the pipeline as typed functions, for scripts and other tools (no Typer, no printing).

Each function takes the matrix (a path or an already loaded one) and returns a value; errors are
:class:`buildkit.errors.AscendkitError` subclasses carrying the exit code the CLI would use. The CLI
is one user of the modules below; this is another, with the same checks in the same order.

    import buildkit

    plan = buildkit.plan_image("compat_matrix.yaml", "a3")  # aarch64: the arch of the A3 hosts
    print(plan.tags[0], [layer.name for layer in plan.layers.all])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from buildkit.accuracy.compare import Comparison, compare_runs, load_run
from buildkit.doctor.base import Check
from buildkit.fsio import output_dir
from buildkit.image.build import run_build
from buildkit.image.buildplan import BuildPlan, BuildResult, check_outputs, plan_build
from buildkit.image.engine import connect
from buildkit.image.progress import Reporter
from buildkit.image.render import render_dockerfile
from buildkit.image.verify import collect_facts
from buildkit.image.verify import compare as compare_facts
from buildkit.k8s.render import render as render_k8s
from buildkit.k8s.request import Manifests
from buildkit.k8s.resolve import make_request as make_k8s_request
from buildkit.k8s.resolve import resolve as resolve_k8s
from buildkit.lock.inputs import lock_targets
from buildkit.lock.relock import LockOutcome, check_exclude_newer, index_urls_for, lock_all
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.plan import ImagePlan, hosts_arch, plan_target
from buildkit.plan import plan_image as _plan_image
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run.smoke import SmokeReport, run_smoke
from buildkit.run.smokerequest import make_request
from buildkit.settings import Mirrors
from buildkit.ship.layers.local import load_local_image
from buildkit.ship.options import Published
from buildkit.ship.publish import publish_all
from buildkit.ship.request import publish_request, push_built, push_request
from buildkit.trust.keys import PASSWORD_ENV, Signer, load_signer

MatrixLike = Path | str | LoadedMatrix

__all__ = ["build", "build_and_push", "compare", "k8s_render", "load", "plan_image", "publish", "relock", "render", "smoke", "verify"]


def load(matrix: MatrixLike = DEFAULT_MATRIX) -> LoadedMatrix:
    """The matrix, validated (structure and rules); a LoadedMatrix is returned as it is."""
    return matrix if isinstance(matrix, LoadedMatrix) else load_matrix(Path(matrix))


def plan_image(matrix: MatrixLike, hw: str, *, stack: str | None = None, os: str | None = None, arch: str | None = None) -> ImagePlan:
    """The resolved plan of one image: layers, pins, lock sections, base, tags, labels."""
    loaded = load(matrix)
    return _plan_image(loaded, plan_target(loaded, hw, stack, os), arch or hosts_arch(loaded, hw))


def render(matrix: MatrixLike, hw: str, *, stack: str | None = None, os: str | None = None) -> str:
    """The Dockerfile of one (stack, chip, OS), byte for byte what ``render --all`` commits."""
    loaded = load(matrix)
    return render_dockerfile(loaded, _plan_image(loaded, plan_target(loaded, hw, stack, os)))


def relock(
    matrix: MatrixLike,
    *,
    stack: str | None = None,
    arch: str | None = None,
    mirrors: Mirrors | None = None,
    ca_bundle: Path | None = None,
    upgrade: bool = False,
    exclude_newer: str | None = None,
) -> list[LockOutcome]:
    """Re-lock (stack, arch) targets against the package indexes; writes locks/ beside the matrix.
    ``exclude_newer`` (2026-11-25, or an RFC 3339 time) resolves as the indexes stood then."""
    loaded = load(matrix)
    targets = lock_targets(loaded, stack, arch)
    if exclude_newer is not None:
        check_exclude_newer(exclude_newer)
    urls = index_urls_for(loaded, mirrors or Mirrors())
    return lock_all(loaded, targets, index_urls=urls, ca_bundle=ca_bundle, upgrade=upgrade, exclude_newer=exclude_newer)


def build(
    matrix: MatrixLike,
    hw: str,
    *,
    stack: str | None = None,
    os: str | None = None,
    arch: str | None = None,
    base_image: str | None = None,
    mirrors: Mirrors | None = None,
    repository: str | None = None,
    manifest_dir: Path = Path("manifests"),
    wheelhouse: Path | None = None,
    reporter: Reporter | None = None,
    reverify: bool = False,
    installer: str = "uv",
    builder: str = "auto",
    cache_repo: str | None = None,
    cache_export: bool = True,
) -> BuildResult:
    """Build, verify and tag one image on the Docker engine of the environment (DOCKER_HOST). An
    unchanged image whose passed verification its manifest records is not verified again unless ``reverify``.
    ``installer``: uv (the default) or pip installs the locked layers. ``builder``: auto (BuildKit
    where buildx and the engine give it, else the classic builder), buildkit or classic;
    ``cache_repo``: a registry repository for BuildKit's cache of this stack, chip, OS and arch,
    imported, and exported unless ``cache_export`` is false."""
    build_plan = _build_plan(
        matrix,
        hw,
        stack,
        os,
        arch,
        base_image,
        mirrors,
        repository,
        manifest_dir,
        wheelhouse,
        reverify,
        installer,
        builder=builder,
        cache_repo=cache_repo,
        cache_export=cache_export,
    )
    check_outputs(build_plan)
    return run_build(connect(), build_plan, reporter)


def verify(
    image: str,
    matrix: MatrixLike,
    hw: str,
    *,
    stack: str | None = None,
    os: str | None = None,
    arch: str | None = None,
    base_image: str | None = None,
) -> list[Check]:
    """Check an existing local image against what the matrix says it holds (every check, passed or not)."""
    expected = _build_plan(matrix, hw, stack, os, arch, base_image, None, None, Path("manifests"), None).expected
    client = connect()
    return compare_facts(collect_facts(client, image, expected.distributions, expected.modules, expected.import_modules), expected)


def publish(
    images: list[str],
    registry: str | list[str],
    *,
    manifest_dir: Path = Path("manifests"),
    index: bool = True,
    media_types: str | None = None,
    compression: str = "gzip",
    sign_key: str | None = None,
    passphrase: bytes | None = None,
    lazy: str | None = None,
) -> list[Published]:
    """Push verified local images by digest to each registry (``HOST[:PORT]/REPO``, one or a list),
    then (``index``) their multi-arch index, refused while an arch is missing. ``media_types``:
    None (Docker images, OCI SBOM), "docker" or "oci"; ``compression="zstd"`` also publishes ``<tag>-zstd``.
    ``sign_key`` (a cosign key file or ``env://VAR``) signs every image and index and their provenance;
    its ``passphrase`` defaults to $COSIGN_PASSWORD. ``lazy="soci"`` adds each gzip image's SOCI index.
    The request is checked as ``ascendkit publish`` checks it."""
    request = publish_request(
        images,
        [registry] if isinstance(registry, str) else registry,
        manifest_dir=manifest_dir,
        index=index,
        media_types=media_types,
        compression=compression,
        signer=lambda: _signer(sign_key, passphrase),
        lazy=lazy,
    )
    client = connect()
    local = [load_local_image(client, ref, manifest_dir) for ref in request.images]
    published: list[Published] = []
    for outcome in publish_all(client, local, list(request.targets), index=request.index, options=request.options):
        published += [p for ps in outcome.registries.values() for p in ps]
        published += [p for ps in outcome.indexes.values() for p in ps]
    return published


def build_and_push(
    matrix: MatrixLike,
    hw: str,
    registry: str | list[str],
    *,
    stack: str | None = None,
    os: str | None = None,
    arch: str | None = None,
    base_image: str | None = None,
    mirrors: Mirrors | None = None,
    repository: str | None = None,
    manifest_dir: Path = Path("manifests"),
    index: bool = True,
    media_types: str | None = None,
    compression: str = "gzip",
    sign_key: str | None = None,
    passphrase: bytes | None = None,
    reporter: Reporter | None = None,
    lazy: str | None = None,
) -> tuple[BuildResult, list[Published]]:
    """``ascendkit build --push``: :func:`build`, then the verified image by digest to each registry
    with its SBOM (and, ``index``, the multi-arch index over the arches already there). The push
    options are checked, as the command checks them, before anything is built. Unlike the command,
    it always builds (it returns the build): the command's shortcut for inputs a registry already
    holds the image of is :func:`buildkit.ship.request.reuse_built`."""
    push = push_request([registry] if isinstance(registry, str) else registry, push=True, index=index,
                        media_types=media_types, compression=compression, signed=sign_key is not None, lazy=lazy)  # fmt: skip
    assert push is not None
    push = push.signed_by(_signer(sign_key, passphrase))
    loaded = load(matrix)
    build_plan = _build_plan(loaded, hw, stack, os, arch, base_image, mirrors, repository, manifest_dir, None, False, "uv")
    check_outputs(build_plan)
    client = connect()
    result = run_build(client, build_plan, reporter)
    outcome = push_built(client, loaded, build_plan, result, push)
    return result, [*outcome.pushed, *(outcome.index or [])]


def _signer(sign_key: str | None, passphrase: bytes | None) -> Signer | None:
    if sign_key is None:
        return None
    return load_signer(sign_key, passphrase if passphrase is not None else os.environ.get(PASSWORD_ENV, "").encode())


def smoke(
    image: str | None,
    matrix: MatrixLike,
    hw: str,
    out: Path,
    *,
    stack: str | None = None,
    job: str = "grpo",
    steps: int | None = None,
    check_only: bool = False,
    config_check: bool = True,
    model_path: Path | None = None,
    data_path: Path | None = None,
    baseline: Path | None = None,
    devices: str | None = None,
    overrides: Sequence[str] = (),
    env: Sequence[str] = (),
    timeout: float = 1800.0,
    stall_timeout: float = 900.0,
    privileged: bool = False,
    as_root: bool = False,
    echo: Callable[[str], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> SmokeReport:
    """The config check, doctor and (on an NPU host) the image's smoke job (``job``: grpo, or verl's
    sft); writes the report to ``out``. ``image`` None: the local build of ``stack`` for ``hw``. The
    options are `ascendkit smoke`'s, checked by the same request (:func:`buildkit.run.smokerequest.make_request`)."""
    request = make_request(
        load(matrix),
        hw,
        out,
        image=image,
        stack=stack,
        job=job,
        steps=steps,
        timeout=timeout,
        stall_timeout=stall_timeout,
        model_path=model_path,
        data_path=data_path,
        baseline=baseline,
        devices=devices,
        privileged=privileged,
        as_root=as_root,
        overrides=overrides,
        env=env,
        check_only=check_only,
        config_check=config_check,
        progress=progress,
    )
    with output_dir(out, "report directory"):
        return run_smoke(connect(), request, echo=echo)


def k8s_render(image: str, matrix: MatrixLike, hw: str, *, stack: str | None = None, **options: Any) -> Manifests:
    """The Kubernetes manifests `ascendkit k8s render` writes for ``image`` on the SKU ``hw``: the
    same request (:func:`buildkit.k8s.resolve.make_request`, ``options`` are its keywords: nodes,
    job, scheduler, namespace...), resolved at the registry the same way (a tag pinned to its
    digest; the stack, framework and user from the image's labels, else ``stack``). The warnings
    say what could not be looked up and what was assumed instead."""
    loaded = load(matrix)
    resolved = resolve_k8s(loaded, make_k8s_request(loaded, hw, image, stack=stack, **options), stack)
    manifests = render_k8s(resolved.request)
    return Manifests(manifests.text, (*resolved.notes, *resolved.warnings, *manifests.warnings))


def compare(npu_log: Path, baseline: Path, tolerances: list[tuple[str, float]] | None = None, throughput_steps: int = 4) -> Comparison:
    """The seeds' accuracy gate on two training logs (or a log and a baseline file)."""
    return compare_runs(load_run(npu_log), load_run(baseline), tolerances, throughput_steps)


def _build_plan(
    matrix: MatrixLike,
    hw: str,
    stack: str | None,
    os: str | None,
    arch: str | None,
    base_image: str | None,
    mirrors: Mirrors | None,
    repository: str | None,
    manifest_dir: Path,
    wheelhouse: Path | None,
    reverify: bool = False,
    installer: str = "uv",
    *,
    builder: str = "auto",
    cache_repo: str | None = None,
    cache_export: bool = True,
) -> BuildPlan:
    return plan_build(
        load(matrix),
        hw,
        stack=stack,
        os_name=os,
        arch=arch,
        base_image=base_image,
        mirrors=mirrors,
        repository=repository,
        manifest_dir=manifest_dir,
        wheelhouse=wheelhouse,
        reverify=reverify,
        installer=installer,
        builder=builder,
        cache_repo=cache_repo,
        cache_export=cache_export,
    )
