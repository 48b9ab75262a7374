"""Build one image per (stack, chip, OS, arch) with BuildKit (through buildx) or the engine's
classic builder (through docker-py): :mod:`buildkit.image.buildx` says which and why.

``run_build`` executes a :class:`BuildPlan` (:mod:`buildkit.image.buildplan` makes it): check
the base image can be had -> render into a temporary context -> build untagged while streaming
progress -> verify the image in a short-lived container -> write the build manifest -> tag.
A failure or Ctrl-C leaves no tag and no container behind.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import DockerException, NotFound

from buildkit.cancel import deferred, interrupted
from buildkit.doctor.base import Check
from buildkit.errors import BuildFailed, Unavailable, VerifyFailed
from buildkit.fsio import write_atomic
from buildkit.image.archive import ImageIdentity, identify, remember_config
from buildkit.image.buildplan import BuildPlan, BuildResult, check_outputs, host_arch
from buildkit.image.buildx import BUILDKIT, Builder, choose_builder
from buildkit.image.context import write_context
from buildkit.image.engine import CONTAINERD_STORE, EngineFacts, connect, engine_facts, remove_containers
from buildkit.image.manifest import manifest_data, recorded_check, verified_before, write_manifest
from buildkit.image.progress import BuildProgress, QuietReporter, Reporter
from buildkit.image.record import build_record
from buildkit.image.render import SECRETS_ARG
from buildkit.image.sbom import BaseImage, dumps, sbom_document, sbom_path
from buildkit.image.secrets import SecretServer
from buildkit.image.solve import SolveProgress
from buildkit.image.verify import collect_facts, compare, failures
from buildkit.image.with_buildx import build_with_buildx
from buildkit.imageref import split_ref
from buildkit.reach import engine_said


def ensure_base_image(client: docker.APIClient, plan: BuildPlan, timeout: int = 20) -> None:
    """Fail within seconds when the base is neither on the engine nor reachable in its registry."""
    try:
        client.inspect_image(plan.base_image)
        return
    except NotFound:
        pass
    answer, reason = _ask_registry(plan.base_image, timeout)
    if answer is not None:
        return
    mirrors = "\n".join(f"    --base-registry {m.rsplit('/', 1)[0]}" for m in plan.base_mirrors)
    mirrors = mirrors or "    --base-registry HOST/PATH (where your mirror serves the CANN images)"
    raise Unavailable(
        f"base image {plan.base_image} is not on this engine and its registry cannot be reached ({reason}).\n"
        f"  Use a mirror of the CANN images:\n{mirrors}\n"
        "  or a base you already have: --base-image REF (pull or `docker load` it first)"
    )


def _build(client: docker.APIClient, plan: BuildPlan, progress: BuildProgress) -> str:
    """The classic builder, through docker-py: the image's ID."""
    with tempfile.TemporaryDirectory(prefix="ascendkit-context-") as context, ExitStack() as cleanup:
        write_context(plan, Path(context), "classic")
        buildargs = dict(plan.buildargs)
        network_mode = None
        if plan.secrets:
            server = cleanup.enter_context(SecretServer(plan.secrets))
            buildargs[SECRETS_ARG] = server.url
            network_mode = "host"  # the RUN steps reach the secret server on 127.0.0.1
        stream = client.build(
            path=context,
            dockerfile="Dockerfile",
            buildargs=buildargs,
            decode=True,
            rm=True,
            forcerm=True,  # intermediate containers go even when a step fails
            nocache=plan.no_cache,
            pull=False,
            network_mode=network_mode,
            platform=plan.platform if plan.arch != host_arch() else None,
        )
        try:
            for event in stream:
                progress.feed(event)
        except KeyboardInterrupt:
            client.close()  # dropping the connection makes the engine cancel the build
            raise
        except (DockerException, requests.exceptions.RequestException) as exc:
            progress.error = progress.error or f"lost the engine: {engine_said(exc)}"
        finally:
            progress.close()
    if progress.error or not progress.image_id:
        progress.error = progress.error or "the engine reported no image"
        raise BuildFailed(progress.failure_message())
    return progress.image_id


def base_of(client: docker.APIClient, ref: str, engine: EngineFacts) -> BaseImage:
    """The base as the engine has it: its registry digest when a registry gave it, else its config
    digest (a base that was loaded, not pulled). The graph-driver stores record a repository digest
    only from a pull or push; the containerd store gives every image one, made locally for a loaded
    image, so there a digest counts only when the registry serves ``ref`` at that digest now."""
    inspect = client.inspect_image(ref)
    name = split_ref(ref)[0]
    layers = len((inspect.get("RootFS") or {}).get("Layers") or [])
    digests = [d for d in inspect.get("RepoDigests") or [] if d.partition("@")[0] == name] or list(inspect.get("RepoDigests") or [])
    if digests:
        digest = sorted(digests)[0].partition("@")[2]
        if engine.image_store != CONTAINERD_STORE or registry_digest(ref) == digest:
            return BaseImage(ref, digest, True, layers)
    return BaseImage(ref, identify(client, ref, inspect, engine.image_store).config, False, layers)


def base_for(client: docker.APIClient, ref: str, engine: EngineFacts, known: BaseImage | None = None) -> BaseImage:
    """``known`` when it is ``ref``'s (found earlier in this command), else :func:`base_of` ``ref``."""
    return known if known is not None and known.ref == ref else base_of(client, ref, engine)


def local_base(client: docker.APIClient, ref: str) -> BaseImage | None:
    """:func:`base_of` the engine's own ``ref``; None when the engine does not hold it (the build pulls it)
    or cannot say now (the build then meets the engine's failure, and reports it)."""
    try:
        return base_of(client, ref, engine_facts(client))
    except (DockerException, requests.exceptions.RequestException):
        return None


def _ask_registry(ref: str, timeout: int = 20) -> tuple[dict[str, Any] | None, str]:
    """What ``ref``'s registry says of it, through the engine (its mirrors and credentials), on a
    connection of its own that gives up within ``timeout`` seconds; else None and why."""
    quick = connect(timeout=timeout)
    try:
        return quick.inspect_distribution(ref), ""
    except (DockerException, requests.exceptions.RequestException, OSError) as exc:
        return None, engine_said(exc)
    finally:
        quick.close()


def registry_digest(ref: str) -> str | None:
    """The digest ``ref``'s registry serves it at, or None when the registry cannot say."""
    answer, _ = _ask_registry(ref)
    digest = ((answer or {}).get("Descriptor") or {}).get("digest")
    return str(digest) if digest else None


def _tag(client: docker.APIClient, image_id: str, refs: list[str]) -> None:
    for ref in refs:
        repository, tag = ref.rsplit(":", 1)
        client.tag(image_id, repository, tag, force=True)


def run_build(client: docker.APIClient, plan: BuildPlan, reporter: Reporter | None = None, base: BaseImage | None = None) -> BuildResult:
    """Build, verify and tag ``plan``. ``base``: its base as :func:`local_base` already found it in this command (`build
    --push` works it out to find the image by its inputs), so that the record names the very digest the inputs tag was
    made from and the containerd store's base, which has no registry digest, is not hashed twice."""
    check_outputs(plan)
    started = time.monotonic()
    progress = BuildProgress(reporter or QuietReporter())
    try:
        engine = engine_facts(client)
        builder = choose_builder(plan.builder, engine, cache=bool(plan.cache_ref), export=plan.cache_export)
        if builder.name == BUILDKIT:
            progress = SolveProgress(progress.reporter)
        ensure_base_image(client, plan)
        if isinstance(progress, SolveProgress):
            engine_id, config, progress = build_with_buildx(client, plan, builder, progress)
        else:
            engine_id, config = _build(client, plan, progress), None
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (buildkit.cancel)
        fresh = connect(timeout=60)  # the build's own connection was closed to cancel it
        time.sleep(1)
        remove_containers(fresh, progress.containers)
        raise interrupted(exc, "the build was stopped; no tag was created and its containers were removed") from None
    except BuildFailed:
        remove_containers(client, progress.containers)
        raise
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"the engine failed: {engine_said(exc)}") from None
    # what the image is, whatever this engine calls it
    image = remember_config(engine_id, config) if config else identify(client, engine_id, store=engine.image_store)
    sbom = sbom_path(plan.manifest_dir, plan.manifest_name)
    before = None if plan.reverify else verified_before(plan.manifest_dir, plan.manifest_name, image.config, plan.expected, plan.refs)
    if before is not None and sbom.is_file():  # an unchanged image, verified against the same matrix: tag it
        with deferred():
            _tag(client, image.engine_id, plan.refs)
        checks = [recorded_check(check) for check in before["checks"]]
        ran_on = _engine_fields(before["image"], image, engine, _builder_record(plan, builder, progress))
        updates = {"build": build_record(plan, base_for(client, plan.base_image, engine, base), builder.name), **ran_on}
        if any(before.get(key) != value for key, value in updates.items()):  # what this build ran from and on
            with deferred():
                write_manifest(plan.manifest_dir, plan.manifest_name, {**before, **updates})
        manifest = (plan.manifest_dir / f"{plan.manifest_name}.json", plan.manifest_dir / f"{plan.manifest_name}.md")
        return _result(plan, image, started, (builder, progress), checks, manifest, sbom, "reused")
    try:
        facts = collect_facts(
            client, image, plan.expected.distributions, plan.expected.modules, plan.expected.import_modules
        )  # its container is removed however it ends
    except KeyboardInterrupt as exc:
        raise interrupted(
            exc, f"image {image.config[:19]} was built but not verified; nothing was tagged and no manifest written"
        ) from None
    checks = compare(facts, plan.expected)
    base = base_for(client, plan.base_image, engine, base)
    data = manifest_data(facts, plan.expected, checks, plan.refs)
    data.update(
        build=build_record(plan, base, builder.name),
        **_engine_fields(data["image"], image, engine, _builder_record(plan, builder, progress)),
    )
    bad = failures(checks)
    with deferred():  # the manifest, the SBOM and every tag, or (stopped before this) none of them
        manifest_json, manifest_md = write_manifest(plan.manifest_dir, plan.manifest_name, data)
        if not bad:
            write_atomic(sbom, dumps(sbom_document(facts, plan.image, base, plan.repository)))
            _tag(client, image.engine_id, plan.refs)
    if bad:
        lines = "\n".join(f"    {c.name}: expected {c.expected}, found {c.actual}" for c in bad)
        raise VerifyFailed(f"image {image.config[:19]} does not match the matrix; nothing was tagged:\n{lines}\n  manifest: {manifest_md}")
    return _result(plan, image, started, (builder, progress), checks, (manifest_json, manifest_md), sbom, "ran")


def _engine_fields(recorded: dict[str, Any], image: ImageIdentity, engine: EngineFacts, builder: dict[str, Any]) -> dict[str, Any]:
    """What the build manifest says of the engine and builder: their facts, and the image as
    ``recorded`` with this engine's ID of it where that is not the config digest."""
    named = {k: v for k, v in recorded.items() if k != "engine_id"}
    if image.engine_id != image.config:
        named = {**named, "engine_id": image.engine_id}
    return {"image": named, "engine": engine.describe(), "builder": builder}


def _builder_record(plan: BuildPlan, builder: Builder, progress: BuildProgress) -> dict[str, Any]:
    """The builder, how many of its steps came from cache, and the registry cache it used."""
    return {
        **builder.describe(),
        "steps_total": progress.cacheable_steps,
        "steps_cached": progress.cached_steps,
        "cache": plan.cache_ref or None,
        "cache_exported": bool(plan.cache_ref) and plan.cache_export,
    }


def _result(
    plan: BuildPlan,
    image: ImageIdentity,
    started: float,
    ran: tuple[Builder, BuildProgress],
    checks: list[Check],
    manifest: tuple[Path, Path],
    sbom: Path,
    verification: str,
) -> BuildResult:
    builder, progress = ran
    return BuildResult(
        image_id=image.config,
        engine_id=image.engine_id,
        refs=plan.refs,
        arch=plan.arch,
        duration_s=time.monotonic() - started,
        steps_total=progress.cacheable_steps,
        steps_cached=progress.cached_steps,
        checks=checks,
        manifest_json=manifest[0],
        manifest_md=manifest[1],
        sbom=sbom,
        verification=verification,
        builder=builder.name,
        builder_version=builder.version,
        notes=tuple(filter(None, (builder.note, *getattr(progress, "warnings", ())))),
    )
