"""The team's lock: its packages resolved by uv with every package of the base as a constraint.

Nothing of the base may move. uv gets each base package's ``name==version`` as a constraint and as a build
constraint (constraints do not reach build dependencies), so a team package that needs another version of a base
package makes the resolution fail; ascendkit then resolves the team's packages alone to say which base package
moves, which team package asked for it and which base package holds it where it is. Mainline ``triton`` and CUDA
packages are refused by name, whoever brings them. A base package named in the team file's ``replace`` (each with
its reason) is the one escape: it is resolved free and the lock records it.

The lock (``ascendkit-team-<arch>.lock`` beside the team file) lists only what the team adds, with hashes; its
header carries the digest of every input (the team file, its requirement files, the base's lock), so it goes stale,
and ``ascendkit team check`` says so, when any of them changes.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from buildkit.errors import AscendkitError, ExitCode, InputError, Unavailable
from buildkit.fsio import write_atomic
from buildkit.lock.index import IndexClient, IndexUnreachable, ProjectMissing
from buildkit.lock.inputs import UV_TIMEOUT_S, LockTarget, lock_inputs
from buildkit.lock.lockfile import LockedPackage, read_lock
from buildkit.lock.resolve import parse_uv_output, uv_binary, uv_version
from buildkit.lock.sdist import public_url
from buildkit.matrix.load import LoadedMatrix
from buildkit.plan import lock_path
from buildkit.team.fork import ForkWheel
from buildkit.team.spec import LoadedTeam

TEAM_LOCK_FORMAT = "1"
TEAM_LAYER = "team-deps"
FORK_LAYER = "team-framework"
# Packages that would overwrite the NPU stack: mainline triton owns triton/ as triton-ascend does; CUDA wheels pull
# CUDA runtimes an NPU image must not carry.
# nvidia-ml-py is NVML's pure-Python bindings (ctypes, no CUDA library), which loggers (swanlab, via pynvml) bring.
_CUDA = re.compile(r"^(nvidia-(?!ml-py3?$).*|.*-cu\d+|cupy-cuda.*|cuda-python|cuda-bindings|pytorch-triton.*)$")


class TeamRefused(AscendkitError):
    """The team's packages would move the base, or bring what an NPU image must not carry (exit 1)."""

    exit_code = ExitCode.CHECK_FAILED


class BaseUnresolved(AscendkitError):
    """The base's lock could not be resolved where it was made: nothing to hold the team's packages to (exit 8)."""

    exit_code = ExitCode.UNVERIFIED


@dataclass(frozen=True)
class BasePackage:
    key: str
    version: str
    via: tuple[str, ...]


@dataclass(frozen=True)
class TeamBase:
    """What the team's lock is held to: the base's locked packages for one arch, and how to resolve for it."""

    stack_id: str
    sku: str
    image: str  # the published image it was read from ("" for a stack of the matrix)
    arch: str
    python: str
    platform: str
    framework: str
    framework_dist: str
    packages: dict[str, BasePackage]
    indexes: tuple[tuple[str, str], ...]
    lock_sha256: str
    # the matrix stack's pins (distribution -> version, as verification checks them), where the matrix has the stack:
    # what a team image's provenance records and `verify` holds it to
    pins: tuple[tuple[str, str], ...] = ()


def team_base(loaded: LoadedMatrix, team: LoadedTeam, arch: str) -> TeamBase:
    """The base of ``team`` for ``arch``: its stack's lock, which must be resolved (its pins known by hash)."""
    stack_id, sku = team.spec.base.stack, team.spec.base.sku
    assert stack_id is not None and sku is not None, "the image form reads its base from the image (team.inimage.image_base)"
    stack = loaded.matrix.stacks[stack_id]
    if arch not in stack.arches:
        raise InputError(f"stack {stack_id} is not built for {arch}; it is for {', '.join(stack.arches)}")
    path = loaded.path.parent / lock_path(stack_id, arch)
    lock = read_lock(path)
    if not lock.resolved:
        raise BaseUnresolved(f"{path}: the base's lock is unresolved ({lock.header.get('reason', '')}): its packages are not known by hash")
    inputs = lock_inputs(loaded, LockTarget(stack_id, arch))
    packages = {p.key: BasePackage(p.key, p.version, tuple(p.via)) for _, p in lock.packages}
    framework = stack.framework
    stanza = stack.frameworks[framework]
    dist = canonicalize_name(getattr(stanza, "package", None) or framework)
    return TeamBase(
        stack_id, sku, "", arch, inputs.python, inputs.platform, framework, dist, packages, inputs.indexes,
        hashlib.sha256(path.read_bytes()).hexdigest(),
    )  # fmt: skip


def lock_file(team: LoadedTeam, arch: str) -> Path:
    return team.root / f"ascendkit-team-{arch}.lock"


def inputs_digest(team: LoadedTeam, base: TeamBase) -> str:
    """What the lock depends on: the team file, each requirement file, the base's lock, the format."""
    digest = hashlib.sha256(f"format {TEAM_LOCK_FORMAT}\n".encode())
    for name, text in (("team", team.text), *team.requirement_texts, ("base", base.lock_sha256)):
        digest.update(f"{name}\n{len(text)}\n{text}\n".encode())
    return digest.hexdigest()


@dataclass
class TeamResolution:
    added: list[LockedPackage]
    replaced: list[tuple[LockedPackage, str, str]] = field(default_factory=list)  # (package, base version, reason)
    fork: ForkWheel | None = None


def free_of(team: LoadedTeam, base: TeamBase) -> set[str]:
    """The base distributions the team may move: those ``replace`` names, and the framework when the team has its fork."""
    free: set[str] = {canonicalize_name(name) for name in team.spec.replace}
    if team.spec.framework is not None:
        free.add(base.framework_dist)
    return free


def _roots(team: LoadedTeam, fork: ForkWheel | None) -> list[str]:
    return [r.line for r in team.requirements] + list(fork.requires if fork else ())


def base_constraints(team: LoadedTeam, base: TeamBase) -> list[str]:
    """Every base package the team may not move, as ``name==version``."""
    free = free_of(team, base)
    return sorted(f"{p.key}=={p.version}" for p in base.packages.values() if p.key not in free)


def _uv(
    team: LoadedTeam, base: TeamBase, index_urls: dict[str, str], *, constrained: bool, fork: ForkWheel | None = None
) -> tuple[int | None, str, list[LockedPackage]]:
    """uv's exit code (None: it did not finish in UV_TIMEOUT_S), what it said, and what it resolved."""
    with tempfile.TemporaryDirectory(prefix="ascendkit-team-") as tmp:
        work = Path(tmp)
        (work / "team.in").write_text("".join(f"{line}\n" for line in _roots(team, fork)), encoding="utf-8")
        free = free_of(team, base)
        pins = [f"{p.key}=={p.version}\n" for p in base.packages.values() if p.key not in free] if constrained else []
        (work / "base.txt").write_text("".join(sorted(pins)), encoding="utf-8")
        primary, *extras = [name for name, _ in base.indexes]
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        env["UV_INDEX_URL"] = index_urls[primary]
        env["UV_EXTRA_INDEX_URL"] = " ".join(index_urls[name] for name in extras)
        command = [
            uv_binary(), "pip", "compile", "--quiet", "--no-config", "team.in",
            "--constraint", "base.txt", "--build-constraints", "base.txt",
            "--python-platform", base.platform, "--python-version", base.python,
            "--generate-hashes", "--emit-index-annotation", "--annotation-style", "split", "--no-header",
            "--output-file", "out.txt",
        ]  # fmt: skip
        try:
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=UV_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None, f"uv did not finish in {UV_TIMEOUT_S} s", []
        message = done.stderr.strip() or done.stdout.strip()
        for url in index_urls.values():
            message = message.replace(url, public_url(url))
        out = work / "out.txt"
        packages = parse_uv_output(out.read_text(encoding="utf-8")) if done.returncode == 0 and out.exists() else []
        return done.returncode, message, packages


def check_indexes(team: LoadedTeam, base: TeamBase, index_urls: dict[str, str], client: IndexClient) -> None:
    """Each index answers before uv runs: one that cannot be reached is exit 4, not a resolution error."""
    probe = team.requirements[0].key if team.requirements else "pip"
    for name, _ in base.indexes:
        try:
            client.project(index_urls[name], probe)
        except IndexUnreachable as exc:
            raise Unavailable(f"index {name} ({public_url(index_urls[name])}) cannot be reached: {exc}") from None
        except ProjectMissing:
            pass


def _who(package: LockedPackage, team: LoadedTeam | None = None) -> str:
    """Who asked for ``package``: the team's own line (file:line) for a root, and the packages uv names."""
    asked = [v for v in package.via if v and not v.startswith("-r ") and v != "team.in"]
    roots = [r.where for r in (team.requirements if team else ()) if r.key == package.key]
    return ", ".join(roots + asked) or "the team file"


def refusals(team: LoadedTeam, base: TeamBase, packages: list[LockedPackage]) -> list[str]:
    """What an NPU image must not get, and base packages a resolution moved, each named with who asked."""
    problems = []
    free = free_of(team, base)
    for package in packages:
        key = package.key
        if key == "triton" or (key.startswith("triton-") and key != "triton-ascend"):
            problems.append(
                f"{key} {package.version}, asked for by {_who(package, team)}: mainline triton writes triton/ over the base's triton-ascend"
            )
        elif _CUDA.match(key):
            problems.append(
                f"{key} {package.version}, asked for by {_who(package, team)}: a CUDA package, which an NPU image must not carry"
            )
        elif key in base.packages and base.packages[key].version != package.version and key not in free:
            held = base.packages[key]
            holders = [v for v in held.via if not v.startswith("pins of layer ")]
            why = f"which {', '.join(holders)} requires" if holders else "which the base pins"
            problems.append(f"{_who(package, team)} requires {key} {package.version}; the base has {key} {held.version}, {why}")
    return problems


def resolve_team(
    team: LoadedTeam, base: TeamBase, index_urls: dict[str, str], client: IndexClient | None = None, fork: ForkWheel | None = None
) -> TeamResolution:
    """The team's packages (and its fork's requirements) resolved against the base; refused (exit 1) when the base
    would move."""
    unknown = sorted(name for name in team.spec.replace if canonicalize_name(name) not in base.packages)
    if unknown:
        raise InputError(f"{team.path}: replace: {', '.join(unknown)} is not a package of the base ({base.stack_id}): nothing to replace")
    check_indexes(team, base, index_urls, client or IndexClient())
    if not _roots(team, fork):
        return TeamResolution([], fork=fork)
    code, message, packages = _uv(team, base, index_urls, constrained=True, fork=fork)
    if code != 0:
        # the base's pins made it fail: resolved alone, the team's packages show which base package they move. With no
        # release that fits the pins, uv can backtrack through every older release (building each sdist) for longer than
        # anyone waits; the same resolution alone then names the cause instead of the timeout.
        alone_code, _, alone = _uv(team, base, index_urls, constrained=False, fork=fork)
        moved = refusals(team, base, alone) if alone_code == 0 else []
        if code is None and not moved:
            raise AscendkitError(message)
        head = "the team's packages move the base: " + "; ".join(moved) if moved else "the team's packages do not resolve with the base's"
        if code is None:
            raise TeamRefused(
                f"{head}\n{message} with the base's pins (it was still trying older releases); resolved without them, the "
                "team's packages take the versions named above. Name each such base package under `replace:` with its reason, "
                "or pin the team package that asks to a release that fits the base."
            )
        raise TeamRefused(f"{head}\nuv says:\n{message}")
    problems = refusals(team, base, packages)
    if problems:
        raise TeamRefused("refused before anything is built:\n  " + "\n  ".join(problems))
    added, replaced = [], []
    reasons: dict[str, str] = {canonicalize_name(k): v for k, v in team.spec.replace.items()}
    for package in packages:
        held = base.packages.get(package.key)
        if package.key == base.framework_dist and fork is not None:
            raise TeamRefused(f"{_who(package, team)} requires {package.key} from an index, but the team's fork replaces it")
        if held is None:
            added.append(package)
        elif held.version != package.version:
            replaced.append((package, held.version, reasons[package.key]))
    return TeamResolution(added, replaced, fork)


def render_team_lock(team: LoadedTeam, base: TeamBase, resolution: TeamResolution) -> str:
    fork = resolution.fork
    lines = [
        f"# ascendkit team lock: {team.spec.name} on {base.stack_id} for {base.arch} ({base.platform}, CPython {base.python}).",
        "# What the team adds to its base, with the hashes its install enforces; every base package is a constraint.",
        f"# Do not edit: run `ascendkit team lock --arch {base.arch}`; `ascendkit team check` says when it is stale.",
        f"# format: {TEAM_LOCK_FORMAT}",
        f"# inputs-sha256: {inputs_digest(team, base)}",
        "# status: resolved",
        f"# resolver: {uv_version()}",
        f"# base: stack {base.stack_id}" + (f", image {base.image}" if base.image else "") + f", lock sha256:{base.lock_sha256}",
    ]
    for name, url in base.indexes:
        lines.append(f"# index {name}: {url}")
    if fork is not None and team.spec.framework is not None:
        lines.append(f"# framework: {fork.pin} from {team.spec.framework.git}@{team.spec.framework.commit}, wheel {fork.path.name}")
        was = base.packages[base.framework_dist].version if base.framework_dist in base.packages else "(none)"
        lines.append(f"# replaces: {base.framework_dist} {was} -> {fork.version}: the team's framework fork")
    for package, was, reason in resolution.replaced:
        lines.append(f"# replaces: {package.key} {was} -> {package.version}: {reason}")
    lines.append(f"# packages: {len(resolution.added) + len(resolution.replaced) + (1 if fork else 0)}")
    lines += ["", f"# layer: {TEAM_LAYER}"]
    for package in sorted([*resolution.added, *(p for p, _, _ in resolution.replaced)], key=lambda p: p.key):
        if not package.hashes:
            raise AscendkitError(f"uv gave no hash for {package.name}=={package.version}")
        hashes = [f"    --hash={h}" for h in sorted(package.hashes)]
        lines.append(f"{package.key}=={package.version} \\")
        lines += [h + " \\" for h in hashes[:-1]] + [hashes[-1]]
        lines.append(f"    # via: {_who(package, team)}")
    if fork is not None:
        lines += [
            "",
            f"# layer: {FORK_LAYER}",
            f"{fork.pin} \\",
            f"    --hash=sha256:{fork.sha256}",
            "    # via: framework (the team's fork)",
        ]
    return "\n".join(lines) + "\n"


def lock_sections(text: str) -> dict[str, str]:
    """A team lock split the way the image installs it: per layer, each with the lock's header (its status)."""
    header, _, body = text.partition("\n# layer: ")
    sections: dict[str, str] = {}
    for block in ("# layer: " + body).split("\n\n# layer: ") if body else []:
        layer = block.removeprefix("# layer: ").split("\n", 1)[0].strip()
        sections[layer] = f"{header}\n\n# layer: {block.removeprefix('# layer: ')}".rstrip("\n") + "\n"
    return sections


def write_team_lock(team: LoadedTeam, base: TeamBase, resolution: TeamResolution) -> Path:
    path = lock_file(team, base.arch)
    write_atomic(path, render_team_lock(team, base, resolution))
    return path


def lock_state(team: LoadedTeam, base: TeamBase) -> str:
    """'fresh', 'missing', or 'stale' (the team file, a requirements file or the base's lock changed since)."""
    path = lock_file(team, base.arch)
    if not path.exists():
        return "missing"
    header = read_lock(path).header
    return "fresh" if header.get("inputs-sha256") == inputs_digest(team, base) else "stale"
