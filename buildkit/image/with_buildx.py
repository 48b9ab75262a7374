"""Build with BuildKit, through ``buildx build --progress=rawjson``: its status read as steps
(:mod:`buildkit.image.solve`), the image loaded untagged into the engine, the secrets as files of
this process's own or served on loopback (:mod:`buildkit.image.secrets`), and a build that BuildKit
failed after exporting its image, on recording it in its history, built again from its cache."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import docker
from docker.errors import NotFound

from buildkit.errors import BuildFailed, Unavailable
from buildkit.image.buildplan import BuildPlan
from buildkit.image.buildx import BUILDKIT, Builder, secret_files, stop
from buildkit.image.context import write_context
from buildkit.image.progress import tell
from buildkit.image.render import SECRETS_ARG
from buildkit.image.secrets import BuildSecrets, SecretServer
from buildkit.image.solve import SolveProgress

HISTORY_TRIES = 3  # builds of one plan when BuildKit fails each on recording it in its history


def build_with_buildx(
    client: docker.APIClient, plan: BuildPlan, builder: Builder, progress: SolveProgress
) -> tuple[str, str | None, SolveProgress]:
    """:func:`_buildx_build`, built again (at most :data:`HISTORY_TRIES` builds) where BuildKit built and exported
    the image and then failed the build on recording it in its history (``SolveProgress.unrecorded``): the steps'
    results are in its cache by then, so the next build of the plan takes them from there (also after
    ``--no-cache``: what this command built, not what an earlier one did) and exports the same image.
    The progress returned is the first build's (what was built, what came from cache), with every note."""
    first, again, tries = progress, plan, 1
    while True:
        try:
            engine_id, config = _buildx_build(client, again, builder, progress)
            break
        except BuildFailed:
            if not progress.unrecorded or tries == HISTORY_TRIES:
                raise
        tries += 1
        note = f"BuildKit built the image, then failed on recording it in its history: built again from cache ({tries} of {HISTORY_TRIES})"
        tell(first.reporter, note)
        first.warnings.append(note)
        progress, again = SolveProgress(first.reporter), replace(plan, no_cache=False)
    if progress is not first:
        first.warnings.extend(w for w in progress.warnings if w not in first.warnings)
        first.error, first.unrecorded = None, False
    return engine_id, config, first


@dataclass(frozen=True)
class BuildxJob:
    """What one ``buildx build`` takes besides the secrets: the reference build's and a team build's differ only here."""

    context: Path  # holds the Dockerfile to build
    platform: str
    no_cache: bool
    progress: Literal["rawjson", "plain"]
    extra: tuple[str, ...] = ()  # -t TAG, --build-arg, --cache-from/--cache-to
    loopback: bool = False  # a mirror the steps reach is on this machine's loopback: they need the host's network


def run_buildx(
    builder: Builder, job: BuildxJob, secrets: BuildSecrets, on_line: Callable[[str], None]
) -> tuple[int, dict[str, Any] | None]:
    """One ``buildx build --load`` of ``job``, each line it prints given to ``on_line``: its exit code and the build
    metadata buildx wrote (None when it wrote none). No provenance or SBOM attestations (they would make the image an
    index; ascendkit writes its own). The secrets are files of this process's own, in memory where /dev/shm is, passed
    as secret mounts; or, where this BuildKit hashes the whole root filesystem for a secret mount
    (``builder.serves_secrets``), served on loopback, their URL in buildx's environment (not its command line, which
    any user of the machine can read); a wheelhouse is always served. Interrupted, buildx is stopped, which cancels
    the solve: BuildKit leaves no container behind."""
    shm = Path("/dev/shm")
    private_root = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None  # secrets stay in memory
    with tempfile.TemporaryDirectory(prefix="ascendkit-build-", dir=private_root) as private, ExitStack() as cleanup:
        metadata = Path(private) / "metadata.json"
        argv = [*builder.command, "build", f"--progress={job.progress}", "--provenance=false", "--sbom=false", "--load"]
        argv += ["--metadata-file", str(metadata), "--platform", job.platform, "-f", str(job.context / "Dockerfile"), *job.extra]
        if job.no_cache:
            argv.append("--no-cache")
        wheels_url, environment = "", None
        if secrets and builder.serves_secrets:  # the CA bundle, the env and any wheelhouse, all served
            environment = {**os.environ, SECRETS_ARG: cleanup.enter_context(SecretServer(secrets)).url}
            argv.append(f"--build-arg={SECRETS_ARG}")
        elif secrets.wheelhouse is not None:  # pip reaches the served wheelhouse on 127.0.0.1
            wheels_url = f"{cleanup.enter_context(SecretServer(secrets)).url}/wheels/"
        # BuildKit's steps get a network of their own, without this machine's loopback. Where the secrets are
        # served, every build takes the host's, with secrets or without: the network is part of a step's cache
        # key, and a build without a CA bundle would otherwise share no step with one that has it.
        if wheels_url or job.loopback or builder.serves_secrets:
            argv += ["--network", "host"]
        if not builder.serves_secrets:
            argv += secret_files(Path(private), secrets.ca_bundle, secrets.env_script(wheels_url))
        argv.append(str(job.context))
        try:
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                start_new_session=True, env=environment,
            )  # fmt: skip
        except OSError as exc:
            raise Unavailable(f"cannot run buildx ({' '.join(builder.command)}): {exc}") from None
        assert process.stdout is not None
        try:
            for line in process.stdout:
                on_line(line)
            code = process.wait()
        except BaseException:
            stop(process)
            raise
        try:
            result = json.loads(metadata.read_text())
        except (OSError, ValueError):
            result = None
    return code, result if isinstance(result, dict) else None


def _buildx_build(client: docker.APIClient, plan: BuildPlan, builder: Builder, progress: SolveProgress) -> tuple[str, str | None]:
    """BuildKit, through :func:`run_buildx`: the image, loaded untagged into the engine; its ID there, and its
    config digest as BuildKit's metadata gives it (None where that does not name the engine's image). Where the
    secrets are served, the render has no secret mounts: the same steps and the same image as with them (no secret
    mount is in its history)."""
    with tempfile.TemporaryDirectory(prefix="ascendkit-context-") as context:
        write_context(plan, Path(context), BUILDKIT, served=builder.serves_secrets)
        extra = [f"--build-arg={name}={value}" for name, value in plan.buildargs]
        if plan.cache_ref:
            extra += ["--cache-from", f"type=registry,ref={plan.cache_ref}"]
        if plan.cache_ref and plan.cache_export:
            extra += ["--cache-to", f"type=registry,ref={plan.cache_ref},mode=max,ignore-error=true"]
        job = BuildxJob(Path(context), plan.platform, plan.no_cache, "rawjson", tuple(extra), loopback=on_loopback(plan))
        try:
            code, result = run_buildx(builder, job, plan.secrets, progress.feed_text)
        except BaseException:
            progress.close(ended=False)
            raise
    progress.close()
    progress.settle(code)
    if code != 0 or progress.error:
        progress.error = progress.error or next(reversed(progress.last_words), "") or f"buildx exited with code {code}"
        raise BuildFailed(progress.failure_message())
    if result is None:
        raise BuildFailed("BuildKit reported no image (buildx wrote no build metadata)")
    config, manifest = result.get("containerimage.config.digest"), result.get("containerimage.digest")
    for candidate in (config, manifest):  # the graph-driver store's ID, else the containerd store's
        if isinstance(candidate, str):
            try:
                engine_id = str(client.inspect_image(candidate)["Id"])
            except NotFound:
                continue
            # The engine calls it by the config digest, or by the digest of the manifest BuildKit wrote, which
            # names that config: no need to read the image back to find it. Anything else is looked up.
            return engine_id, config if isinstance(config, str) and engine_id in (config, manifest) else None
    raise BuildFailed(f"BuildKit built {result.get('containerimage.digest')}, but the engine does not hold it (was it loaded elsewhere?)")


LOOPBACK = re.compile(r"://(?:[^/@]*@)?(?:127\.\d+\.\d+\.\d+|localhost|\[::1\])(?:[:/]|$)", re.IGNORECASE)


def on_loopback(plan: BuildPlan) -> bool:
    """Whether a mirror the build was pointed at (an index, a git host, the apt archive) is on this
    machine's loopback: the RUN steps then need the host's network to reach it, as the classic
    builder's do when ascendkit serves them secrets."""
    values = [value for _, value in plan.buildargs] + [value for _, value in plan.secrets.env]
    return any(LOOPBACK.search(value) for value in values)
