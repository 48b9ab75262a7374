"""``ascendkit team build``: the team's layers built on its base by digest, then checked: every distribution of the
base (name, version, RECORD, direct_url) is as it was, unless the team file's ``replace`` names it. Only an image
that passes is tagged; one that fails is removed, with its containers.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from contextlib import ExitStack, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import DockerException, ImageNotFound

from buildkit.arch import DOCKER_ARCH
from buildkit.cancel import deferred
from buildkit.errors import BuildFailed, ExitCode, InputError, Unavailable, VerifyFailed
from buildkit.fsio import check_output_dir, write_atomic
from buildkit.image.archive import identify
from buildkit.image.buildx import BUILDKIT, Builder, choose_builder
from buildkit.image.engine import engine_facts, remove_containers
from buildkit.image.manifest import write_manifest
from buildkit.image.render import SECRETS_ARG
from buildkit.image.sbom import dumps, sbom_path
from buildkit.image.secrets import BuildSecrets, SecretServer
from buildkit.image.verify import collect_facts
from buildkit.image.with_buildx import LOOPBACK, BuildxJob, run_buildx
from buildkit.imageref import split_ref
from buildkit.lock.index import IndexClient
from buildkit.lock.sdist import public_url
from buildkit.plan.image import arch_tag
from buildkit.reach import engine_said
from buildkit.team.dockerfile import (
    TeamBuildInputs,
    classic,
    files_digest,
    labels,
    naming_locks,
    render_team_dockerfile,
    write_team_context,
)
from buildkit.team.fork import WHEELS_DIR, read_wheel
from buildkit.team.inimage import distributions, imports, moved, shared, wheel_overlap
from buildkit.team.prebuild import check_team_wheels
from buildkit.team.record import TeamChecked, base_image_of, team_manifest, team_sbom
from buildkit.team.resolve import FORK_LAYER, TeamBase, TeamRefused, free_of, lock_file, lock_sections, lock_state
from buildkit.team.spec import LoadedTeam


@dataclass(frozen=True)
class TeamBuilt:
    image_id: str
    refs: tuple[str, ...]
    base_ref: str
    added: tuple[str, ...]
    kept: int
    dockerfile: str
    record: Path
    unread: tuple[str, ...] = ()  # team packages whose files only the check after the build could hold to the base's


def base_by_digest(client: docker.APIClient, base: TeamBase, team: LoadedTeam, ref: str) -> tuple[str, str, dict[str, Any]]:
    """The base by digest, its user and its inspect; refused when its labels name another stack or SKU."""
    try:
        inspect: dict[str, Any] = client.inspect_image(ref)
    except ImageNotFound:
        raise Unavailable(f"base image {ref} is not on this engine: pull it first (or build it: ascendkit build --hw {base.sku})") from None
    labels_ = inspect.get("Config", {}).get("Labels") or {}
    stack, skus = labels_.get("io.ascendkit.stack"), (labels_.get("io.ascendkit.skus") or "").split(",")
    if stack != base.stack_id or base.sku not in skus:
        what = f"stack {stack} for {', '.join(skus)}" if stack else "not an ascendkit image (no io.ascendkit.stack label)"
        raise InputError(f"{team.path}: base is stack {base.stack_id} for {base.sku}, but {ref} is {what}")
    digests = [d for d in inspect.get("RepoDigests") or [] if "@sha256:" in d]
    named = split_ref(ref)[0]  # the repository the user named first: the same image may have been pushed to several
    ours = sorted(d for d in digests if d.split("@")[0] == named) or sorted(digests)
    by_digest = ours[0] if ours else inspect["Id"]
    return by_digest, inspect.get("Config", {}).get("User") or "", inspect


def _from_ref(builder: Builder, base_image: str, base_ref: str) -> str:
    """What the Dockerfile's FROM names: the base by digest for the classic builder, which finds a repository digest in
    the engine's store. BuildKit resolves ``NAME@sha256:...`` at the registry, which a base built here or pulled from a
    mirror under another name never came from: it gets the reference the user gave, and the build is then held to the
    base by its layers (:func:`_on_the_base`)."""
    return base_image if builder.name == BUILDKIT and "@" not in base_image else base_ref


def _on_the_base(client: docker.APIClient, image_id: str, base_inspect: dict[str, Any], base_ref: str) -> None:
    """VerifyFailed unless the image's first layers are the base's, every one (the base's tag moved during the build)."""
    layers = list((base_inspect.get("RootFS") or {}).get("Layers") or [])
    built = list((client.inspect_image(image_id).get("RootFS") or {}).get("Layers") or [])
    if built[: len(layers)] != layers:
        raise VerifyFailed(f"the team image is not on its base {base_ref} (its first layers are another image's: was the tag moved?)")


def _build(client: docker.APIClient, context: Path, tag: str, secrets: BuildSecrets, no_cache: bool = False) -> str:
    """The classic builder through docker-py. A CA bundle (a TLS-intercepting proxy's) and index credentials reach the
    RUN steps as the reference builds give them: served on a loopback URL in ftp_proxy, which no layer, config or
    history keeps."""
    containers: list[str] = []
    image_id, error, tail = "", "", list[str]()
    with ExitStack() as stack:
        buildargs, network_mode = {}, None
        if secrets:
            server = stack.enter_context(SecretServer(secrets))
            buildargs, network_mode = {SECRETS_ARG: server.url}, "host"
        try:
            stream = client.build(
                path=str(context), dockerfile="Dockerfile", tag=tag, rm=True, forcerm=True, pull=False, decode=True, nocache=no_cache,
                buildargs=buildargs, network_mode=network_mode,
            )  # fmt: skip
            image_id, error = _follow(stream, containers, tail)
        except (DockerException, requests.exceptions.RequestException) as exc:
            error = error or f"lost the engine: {engine_said(exc)}"
    if error or not image_id:
        remove_containers(client, containers)
        raise BuildFailed("the team image's build failed: " + (error or "the engine reported no image") + "\n" + "\n".join(tail[-15:]))
    return image_id


def _buildkit(
    client: docker.APIClient, builder: Builder, context: Path, dockerfile: str, plan: tuple[str, str, bool], secrets: BuildSecrets
) -> str:
    """BuildKit, through :func:`buildkit.image.with_buildx.run_buildx` as reference images are built: the team's
    Dockerfile with its pip cache mount, the secrets as secret mounts, or served on loopback where this BuildKit hashes
    the whole root filesystem for a secret mount (then the render has none); the image loaded into the engine under
    ``tag``. ``plan``: (tag, platform, no_cache). Its ID in the engine."""
    tag, platform, no_cache = plan
    text = dockerfile.replace(SECRET_MOUNTS, "") if builder.serves_secrets else dockerfile
    (context / "Dockerfile").write_text(text, encoding="utf-8")
    # the steps reach an index on this machine's loopback (a mirror, a devpi) only on the host's network
    loopback = any(LOOPBACK.search(url) for url in [*(u for _, u in secrets.env), *_index_urls(text)])
    tail: list[str] = []

    def keep(line: str) -> None:
        tail.append(line.rstrip())
        del tail[:-30]

    job = BuildxJob(context, platform, no_cache, "plain", ("-t", tag), loopback=loopback)
    code, result = run_buildx(builder, job, secrets, keep)
    if code != 0:
        raise BuildFailed(f"the team image's build failed (buildx exited {code}):\n" + "\n".join(tail[-15:]))
    if result is None:  # buildx may have loaded the image and tagged it before it failed to say so: no tag left behind
        with suppress(ImageNotFound):
            client.remove_image(tag)
        raise BuildFailed("BuildKit reported no image (buildx wrote no build metadata); nothing was tagged")
    try:
        return str(client.inspect_image(tag)["Id"])
    except ImageNotFound:
        raise BuildFailed(f"BuildKit built {result.get('containerimage.digest')}, but the engine does not hold {tag}") from None


SECRET_MOUNTS = "    --mount=type=secret,id=ascendkit-ca --mount=type=secret,id=ascendkit-env \\\n"


def _index_urls(dockerfile: str) -> list[str]:
    return re.findall(r"^ARG [A-Z0-9_]+=(\S+)$", dockerfile, re.MULTILINE)


def _follow(stream: Any, containers: list[str], tail: list[str]) -> tuple[str, str]:
    """The build's events: its image ID or its error; the containers it ran and the last lines it printed, kept."""
    image_id, error = "", ""
    for event in stream:
        if "error" in event:
            error = str(event["error"]).strip()
        text = str(event.get("stream", ""))
        tail.extend(line for line in text.splitlines() if line.strip())
        del tail[:-30]
        if text.startswith(" ---> Running in "):
            containers.append(text.split()[-1])
        if "aux" in event and "ID" in event["aux"]:
            image_id = event["aux"]["ID"]
    return image_id, error


def index_args_of(base: TeamBase, urls: dict[str, str]) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """The base's indexes as the build gets them (``urls``: each by name, a mirror where one was given): (the ARGs the
    Dockerfile names, credentials stripped: they are in its history; the ones with credentials, given as secrets)."""
    args = [
        ("PIP_INDEX_URL", urls.get(name, url)) if i == 0 else (f"ASCENDKIT_TEAM_INDEX_{i}", urls.get(name, url))
        for i, (name, url) in enumerate(base.indexes)
    ]
    return tuple((arg, public_url(url)) for arg, url in args), tuple((arg, url) for arg, url in args if public_url(url) != url)


def team_inputs(team: LoadedTeam, base: TeamBase, base_of: tuple[str, str], index_args: tuple[tuple[str, str], ...]) -> TeamBuildInputs:
    """What the render needs: the lock's sections and, with a fork, its wheel checked against the lock's hash."""
    path = lock_file(team, base.arch)
    text = path.read_text(encoding="utf-8")
    sections = lock_sections(text)
    pin = source = ""
    if team.spec.framework is not None:
        wheels = sorted((team.root / WHEELS_DIR).glob("*.whl"))
        if len(wheels) != 1:
            raise InputError(f"{team.root / WHEELS_DIR}: the fork's wheel is not there (one .whl): run `ascendkit team lock` again")
        wheel = read_wheel(wheels[0])
        if f"--hash=sha256:{wheel.sha256}" not in sections.get(FORK_LAYER, ""):
            raise InputError(f"{wheels[0]}: not the wheel {path.name} locked (its sha256 differs): run `ascendkit team lock` again")
        pin, source = wheel.pin, f"{team.spec.framework.git}@{team.spec.framework.commit}"
    layers = tuple(layer for layer in sections if any(line[:1].isalnum() for line in sections[layer].splitlines()))
    extra = tuple(arg for arg, _ in index_args[1:])
    lock_sha = hashlib.sha256(text.encode()).hexdigest()
    naming = naming_locks(team, base.arch, lock_sha)
    return TeamBuildInputs(*base_of, index_args, extra, lock_sha, layers, pin, source, files_digest(team), naming_locks=naming)


def build_team(
    client: docker.APIClient,
    team: LoadedTeam,
    base: TeamBase,
    base_image: str,
    urls: dict[str, str],
    ca_bundle: bytes = b"",
    manifest_dir: Path = Path("manifests"),
    no_cache: bool = False,
    builder_choice: str = "auto",
    index_client: IndexClient | None = None,
    repository: str | None = None,
) -> TeamBuilt:
    """Build, check and tag the team image, with its build record and SBOM beside the reference images' (what
    publish, sign, verify and sbom read); refused before building when the lock is not fresh. ``repository``: where it
    is tagged, the team's name unless given (a rebuild's is tagged beside the original)."""
    state = lock_state(team, base)
    if state != "fresh":
        error = InputError(f"{lock_file(team, base.arch)} is {state}: run `ascendkit team lock --arch {base.arch}` first")
        error.exit_code = ExitCode.CHECK_FAILED
        raise error
    check_output_dir(manifest_dir, "--manifest-dir")  # before anything is built
    try:
        engine = engine_facts(client)
        builder = choose_builder(builder_choice, engine)
        base_ref, user, base_inspect = base_by_digest(client, base, team, base_image)
        index_args, secret_env = index_args_of(base, urls)
        inputs = replace(team_inputs(team, base, (base_ref, user), index_args), from_ref=_from_ref(builder, base_image, base_ref))
        dockerfile = render_team_dockerfile(team, base, inputs)
        version = dict(labels(team, base, inputs))["org.opencontainers.image.version"]
        tag = arch_tag(version, base.arch)  # as reference images are tagged per arch: what publish makes an index of
        repository = repository or team.spec.name
        ref = f"{repository}:{tag}"
        before = distributions(client, base_ref)
        if team.spec.framework is not None:
            (wheel,) = sorted((team.root / WHEELS_DIR).glob("*.whl"))
            overlap = wheel_overlap(wheel, base.framework_dist, before, free_of(team, base))
            if overlap:
                raise TeamRefused(
                    "refused before anything is built: the fork would write files the base owns:\n  " + "\n  ".join(overlap[:20])
                )
        wheels = check_team_wheels(team, base, urls, before, index_client)
        if wheels.overlaps:
            raise TeamRefused(
                "refused before anything is built: the team's packages would write files the base owns:\n  "
                + "\n  ".join(wheels.overlaps[:20])
                + (f"\n  ... and {len(wheels.overlaps) - 20} more" if len(wheels.overlaps) > 20 else "")
            )
        unverified, secrets = f"{repository}:unverified-{tag}", BuildSecrets(ca_bundle, secret_env)
        with tempfile.TemporaryDirectory(prefix="ascendkit-team-") as tmp:
            if builder.name == BUILDKIT:
                write_team_context(team, base, dockerfile, Path(tmp))
                image_id = _buildkit(
                    client, builder, Path(tmp), dockerfile, (unverified, f"linux/{DOCKER_ARCH[base.arch]}", no_cache), secrets
                )
            else:
                write_team_context(team, base, classic(dockerfile), Path(tmp))
                image_id = _build(client, Path(tmp), unverified, secrets, no_cache)
        try:
            _on_the_base(client, image_id, base_inspect, base_ref)
            after = distributions(client, image_id)
            problems = moved(before, after, free_of(team, base)) + shared(before, after, free_of(team, base))
            if problems:
                raise VerifyFailed("the team image moved its base; nothing was tagged:\n  " + "\n  ".join(problems))
            ours = sorted(name for name in after if name not in before or after[name] != before[name])
            imported = imports(client, image_id, ours, user or "0:0")
            if imported["failed"]:
                failed = "\n  ".join(f"{module}: {why}" for module, why in sorted(imported["failed"].items()))
                raise VerifyFailed(f"the team's packages do not import in the image (as {user or 'root'}); nothing was tagged:\n  {failed}")
            identity = identify(client, image_id, store=engine.image_store)
            facts = collect_facts(client, identity)  # the verification probe's view: what the SBOM lists
            checked = TeamChecked(
                identity, ref, base_image_of(base_ref, base_inspect), dict(base_inspect.get("Config", {}).get("Labels") or {}),
                before, after, list(imported["imported"]), facts, wheels.unread,
            )  # fmt: skip
            data = team_manifest(team, base, inputs, checked, engine, {**builder.describe(), "steps_total": 0, "steps_cached": 0})
            with deferred():  # the record, the SBOM and the tag, or none of them
                record, _ = write_manifest(manifest_dir, tag, data)
                write_atomic(sbom_path(manifest_dir, tag), dumps(team_sbom(team, base, inputs, checked)))
                client.tag(image_id, repository, tag)
        except BaseException:
            client.remove_image(unverified)  # the only tag: the image goes with it
            raise
        client.remove_image(unverified, noprune=True)
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise Unavailable(f"the engine failed: {engine_said(exc)}") from None
    added = tuple(sorted(f"{name}=={after[name][0]}" for name in after if name not in before))
    return TeamBuilt(identity.config, (ref,), base_ref, added, len(before), dockerfile, record, wheels.unread)
