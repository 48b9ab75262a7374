"""A team image rebuilt from its recorded inputs, in the team's repository: the team file, the lock, the files and the
fork's wheel at hand held to what the image's provenance (or, for a local image, its build record) recorded, the base
on this engine at its recorded digest, then built again with nothing cached by `team build`'s own code, published
beside the original as it was published, and compared (:mod:`buildkit.ship.rebuild`).

What is recorded: the team's name, its lock and files by sha256, its fork's commit, the base by digest, the index
URLs the build named (the Dockerfile's ARGs, which its history keeps), the builder and the epoch; the team file itself
(its environment, labels and file list) by the image's version label, which is a digest of the lock, the files and
the team file. Any of them not as recorded is refused before anything is built (exit 2), naming what differs and the
commit the image was built from. A fork's wheel missing from the checkout is built again from its commit and held to
the lock's hash first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import ImageNotFound

from buildkit.errors import InputError
from buildkit.imageref import split_ref
from buildkit.lock.index import IndexClient
from buildkit.ship.imagediff import read_published
from buildkit.ship.layers.local import load_local_image
from buildkit.ship.publish import publish_image
from buildkit.ship.rebuild import Original, RebuildOutcome, compare, publication, recorded_parts, scratch_push, team_params
from buildkit.team.build import base_by_digest, build_team, index_args_of
from buildkit.team.dockerfile import files_digest, naming_locks, version_label
from buildkit.team.fork import WHEELS_DIR, build_fork, read_wheel
from buildkit.team.resolve import FORK_LAYER, TeamBase, base_constraints, lock_file, lock_sections
from buildkit.team.spec import LoadedTeam

VERSION_LABEL = "org.opencontainers.image.version"


@dataclass(frozen=True)
class TeamRecorded:
    """What a team image was built from, as its provenance records it."""

    where: str
    name: str
    stack: str
    arch: str
    base_ref: str  # NAME@sha256:... (pulled), or the base's config digest (built or loaded here)
    lock: str  # the lock's file name
    lock_sha256: str
    files_sha256: str
    fork_commit: str  # "" without a fork
    build_args: dict[str, str]
    source: str  # git+URL@COMMIT of the team's repository, where known
    builder: str
    epoch: int
    media_types: str
    compression: str

    def describe(self) -> dict[str, Any]:
        return {
            "image": self.where,
            "team": self.name,
            "stack": self.stack,
            "arch": self.arch,
            "base_image": self.base_ref,
            "lock": {self.lock: self.lock_sha256},
            "files_sha256": self.files_sha256,
            "framework_commit": self.fork_commit or None,
            "build_args": self.build_args,
            "source": self.source,
            "builder": self.builder,
            "source_date_epoch": self.epoch,
        }


def team_recorded(original: Original) -> TeamRecorded:
    """The team inputs ``original``'s provenance records; InputError naming what it lacks."""
    team = team_params(original.statement)
    assert team is not None
    params, dependencies, base, source = recorded_parts(original.statement, original.where)
    locks = [d for d in dependencies if str(d.get("name", "")).startswith("lock:")]
    if len(locks) != 1:
        raise InputError(f"{original.where}: its provenance names {len(locks)} locks, not the team's one: its inputs cannot be recovered")
    digest = "sha256:" + str(base["digest"]["sha256"])
    pulled = base.get("mediaType") is None  # a loaded base is named by its config digest alone
    framework = team.get("framework") if isinstance(team.get("framework"), dict) else {}
    media_types, compression = publication(original.manifest)
    return TeamRecorded(
        where=original.where,
        name=str(team.get("name", "")),
        stack=str(params.get("stack", "")),
        arch=str(params.get("arch", "")),
        base_ref=f"{base.get('uri')}@{digest}" if pulled else digest,
        lock=str(locks[0]["name"]).removeprefix("lock:"),
        lock_sha256=str(team.get("lock_sha256", "")),
        files_sha256=str(team.get("files_sha256", "")),
        fork_commit=str((framework or {}).get("commit") or ""),
        build_args={str(k): str(v) for k, v in (params.get("buildArgs") or {}).items()},
        source=source,
        builder=str(params.get("builder") or "auto"),
        epoch=int(params["reproducible"]["source_date_epoch"]),
        media_types=media_types,
        compression=compression,
    )


def original_version(client: docker.APIClient, original: Original) -> str:
    """The original's version label: read from the engine for a local image, from its config for a published one."""
    if original.local is not None:
        labels = (client.inspect_image(original.local.image.identity.engine_id).get("Config") or {}).get("Labels") or {}
    else:
        labels = (read_published(original.where, original.arch).config.get("config") or {}).get("Labels") or {}
    return str(labels.get(VERSION_LABEL, ""))


def check_team_inputs(recorded: TeamRecorded, team: LoadedTeam, base: TeamBase, urls: dict[str, str], version: str) -> None:
    """The team repository at hand is what the image was built from; InputError naming each thing that is not, with
    the commit it was built from (``version``: the original's version label)."""
    at = f"; it was built from {recorded.source}" if recorded.source else ""
    problems = []
    if team.spec.name != recorded.name:
        problems.append(f"{team.path} is team {team.spec.name}; the image is {recorded.name}'s")
    if base.stack_id != recorded.stack:
        problems.append(f"{team.path}'s base is stack {base.stack_id}; the image's is {recorded.stack}")
    path = lock_file(team, recorded.arch)
    lock_sha = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
    if path.name != recorded.lock or lock_sha != recorded.lock_sha256:
        problems.append(f"{path} is not the lock it was built from ({recorded.lock}, sha256 {recorded.lock_sha256[:12]}...)")
    files = files_digest(team)
    if files != recorded.files_sha256:
        sources = ", ".join(copy.src for copy in team.spec.files) or "none"
        problems.append(f"the team's files ({sources}) are not the ones it was built from (sha256 {recorded.files_sha256[:12]}...)")
    commit = team.spec.framework.commit if team.spec.framework else ""
    if commit != recorded.fork_commit:
        problems.append(f"{team.path}'s framework is at {commit or 'none'}; the image's fork was at {recorded.fork_commit or 'none'}")
    elif commit:
        wheels = sorted((team.root / WHEELS_DIR).glob("*.whl"))
        held = lock_sections(path.read_text(encoding="utf-8")).get(FORK_LAYER, "") if lock_sha else ""
        if len(wheels) != 1 or f"--hash=sha256:{read_wheel(wheels[0]).sha256}" not in held:
            problems.append(f"{team.root / WHEELS_DIR}: not the fork's wheel {path.name} locks (it is kept beside the lock, committed)")
    if not problems and version != version_label(team, naming_locks(team, recorded.arch, lock_sha), files):
        problems.append(f"{team.path} is not the team file it was built from (the image's version is {version})")
    args = dict(index_args_of(base, urls)[0])
    if args != recorded.build_args:
        names = sorted(k for k in set(args) | set(recorded.build_args) if args.get(k) != recorded.build_args.get(k))
        was = ", ".join(f"{k}={recorded.build_args.get(k, '(none)')}" for k in names)
        now = ", ".join(f"{k}={args.get(k, '(none)')}" for k in names)
        problems.append(f"it was built with {was}; this rebuild would name {now} (give the index or mirror it was built with)")
    if problems:
        raise InputError(f"{recorded.where}: not rebuilt, its inputs are not the ones at hand{at}:\n  " + "\n  ".join(problems))


def fork_wheel_again(team: LoadedTeam, base: TeamBase, urls: dict[str, str], say: Callable[[str], None] | None = None) -> None:
    """Where the checkout lacks the fork's wheel: built again from its commit, as `team lock` built it (the base's pins,
    the fixed epoch), and kept only when it is the wheel the lock names by sha256. Another wheel is removed again and
    refused (exit 2): the fork's build does not give the same bytes here, and the image cannot be rebuilt from it."""
    framework = team.spec.framework
    wheels = team.root / WHEELS_DIR
    if framework is None or sorted(wheels.glob("*.whl")):
        return
    path = lock_file(team, base.arch)
    held = lock_sections(path.read_text(encoding="utf-8")).get(FORK_LAYER, "") if path.is_file() else ""
    if not held:
        return  # no fork in the lock at hand: check_team_inputs names that lock
    made = [d for d in (wheels, wheels.parent) if not d.exists()]
    (say or (lambda _line: None))(f"{wheels} has no wheel of the fork: building it again from {framework.git}@{framework.commit}")
    wheel = build_fork(team, urls[base.indexes[0][0]], base_constraints(team, base))
    if f"--hash=sha256:{wheel.sha256}" in held:
        return
    wheel.path.unlink()
    for directory in made:  # the checkout left as it was found
        directory.rmdir()
    raise InputError(
        f"the fork at {framework.commit} built again to {wheel.path.name} of sha256 {wheel.sha256}, which {path.name} does not "
        f"lock: its build gives other bytes here, so the image cannot be rebuilt from it (the wheel the lock names is kept "
        f"beside the lock, in {WHEELS_DIR}, for that reason)"
    )


def base_for_build(client: docker.APIClient, recorded: TeamRecorded, base: TeamBase, team: LoadedTeam) -> str:
    """What `team build` is given as the base: a tag this engine has for the recorded base (BuildKit resolves a digest
    reference at the registry, which a base built or loaded here never came from), checked to name the recorded base."""
    try:
        inspect = client.inspect_image(recorded.base_ref)
    except ImageNotFound:
        raise InputError(f"{recorded.where}: built on {recorded.base_ref}, which this engine does not have: pull or load it") from None
    name = split_ref(recorded.base_ref)[0]
    tags = sorted(inspect.get("RepoTags") or [])
    given = next((t for t in tags if split_ref(t)[0] == name), tags[0] if tags else recorded.base_ref)
    if base_by_digest(client, base, team, given)[0] != recorded.base_ref:
        raise InputError(f"{recorded.where}: built on {recorded.base_ref}, which this engine's {given} is not")
    return given


def rebuild_team(
    client: docker.APIClient,
    original: Original,
    team: LoadedTeam,
    base: TeamBase,
    urls: dict[str, str],
    to: str,
    *,
    ca_bundle: bytes = b"",
    manifest_dir: Path = Path("manifests"),
    index_client: IndexClient | None = None,
    say: Callable[[str], None] | None = None,
) -> RebuildOutcome:
    """``original`` (a team image: :func:`buildkit.ship.rebuild.read_original`) rebuilt from the team repository at hand
    with nothing cached, tagged ``<team>-rebuilt`` and recorded in ``<manifest_dir>/rebuilt/`` (the original's tag and
    record left as they were), published to ``to`` as the original was, and compared."""
    recorded = team_recorded(original)
    lock = lock_file(team, recorded.arch)
    recorded_lock = lock.is_file() and hashlib.sha256(lock.read_bytes()).hexdigest() == recorded.lock_sha256
    if recorded_lock and team.spec.framework is not None and team.spec.framework.commit == recorded.fork_commit:
        fork_wheel_again(team, base, urls, say)  # built only for the lock and commit recorded: anything else is refused next
    check_team_inputs(recorded, team, base, urls, original_version(client, original))
    push = scratch_push(to, recorded.media_types)  # refused now, before the build, as the reference rebuild's
    base_image = base_for_build(client, recorded, base, team)
    built = build_team(
        client, team, base, base_image, urls, ca_bundle, manifest_dir / "rebuilt", no_cache=True,
        builder_choice=recorded.builder, index_client=index_client, repository=f"{recorded.name}-rebuilt",
    )  # fmt: skip
    image = load_local_image(client, built.refs[0], manifest_dir / "rebuilt")
    outcome = publish_image(client, image, list(push.targets), want_index=False, require_index=False, options=push.options, say=say)
    rebuilt = {p.compression: p.digest for p in next(iter(outcome.registries.values()))}
    first, compared, zstd, differences = compare(client, original, push, rebuilt, recorded.compression, say)
    build = {"image_id": built.image_id, "tags": list(built.refs), "base": built.base_ref, "record": str(built.record)}
    return RebuildOutcome(recorded.describe(), first, compared, zstd, differences, build)
