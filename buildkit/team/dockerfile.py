"""The team image's Dockerfile and build context: the base by digest, then the team's layers only, least to
most volatile (its locked packages, then its files, then its environment and labels).

The packages install with the base's own ``ascendkit_install`` (``/usr/local/lib/ascendkit/build-env.sh``): the
team's lock lies beside the base's sections under ``/etc/ascendkit/locks/``, every base section is a constraint
with its hashes, and every hash of the team's lock is enforced. The render depends only on its inputs.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from buildkit.errors import ExitCode, InputError
from buildkit.plan.layers import SOURCE_DATE_EPOCH
from buildkit.team.fork import WHEELS_DIR
from buildkit.team.resolve import FORK_LAYER, TEAM_LAYER, TeamBase, lock_file, lock_sections
from buildkit.team.spec import LoadedTeam

CONTEXT_LOCKS = "team/locks"
CONTEXT_FILES = "team/files"
CONTEXT_WHEELS = "team/wheels"
IMAGE_WHEELS = "/opt/ascendkit/team/wheels"  # the fork's wheel, kept in the image: what was installed, by hash
TEAM_LABEL = "io.ascendkit.team"


@dataclass(frozen=True)
class TeamBuildInputs:
    """What the render needs beyond the team file: the base as the engine has it."""

    base_ref: str  # NAME@sha256:... (the base by digest)
    base_user: str  # the base's USER, restored after the team's layers
    index_args: tuple[tuple[str, str], ...]  # (ARG, URL) of the base's indexes, as the matrix names them
    extra_index_args: tuple[str, ...]  # the ARG names pip gets as extra indexes for this arch
    lock_sha256: str
    layers: tuple[str, ...] = (TEAM_LAYER,)  # the team lock's sections
    fork_pin: str = ""  # DIST==VERSION of the team's framework fork, when it has one
    fork_source: str = ""  # URL@COMMIT
    files_sha256: str = ""  # of the team's files as they are copied (paths, modes, contents)
    from_ref: str = ""  # what FROM names, where not base_ref (BuildKit: the reference the user gave; see team.build)
    naming_locks: str = ""  # the locks that name the image, where not lock_sha256 alone (:func:`naming_locks`)


def labels(team: LoadedTeam, base: TeamBase, inputs: TeamBuildInputs) -> tuple[tuple[str, str], ...]:
    """What the team image says it is: its own title and version (not the base's, which it would inherit), its base by
    digest, its lock, and every base package it replaces with the reason."""
    spec = team.spec
    found = [
        ("org.opencontainers.image.title", f"{spec.name} (a team image on ascendkit {base.stack_id})"),
        ("org.opencontainers.image.version", version_label(team, inputs.naming_locks or inputs.lock_sha256, inputs.files_sha256)),
        ("org.opencontainers.image.base.name", inputs.base_ref),
        (TEAM_LABEL, spec.name),
        (f"{TEAM_LABEL}.base-stack", base.stack_id),
        (f"{TEAM_LABEL}.base-sku", base.sku),
        # its multi-arch index: the team's arches (`arches:`), else its own arch's alone; never the base's
        ("io.ascendkit.arches", ",".join(spec.arches) if spec.arches else base.arch),
        (f"{TEAM_LABEL}.lock-sha256", inputs.lock_sha256),
        (f"{TEAM_LABEL}.files-sha256", inputs.files_sha256),
    ]
    if inputs.fork_pin:
        found.append((f"{TEAM_LABEL}.framework", f"{inputs.fork_pin} from {inputs.fork_source}"))
    found += [(f"{TEAM_LABEL}.replaces.{name}", reason) for name, reason in sorted(spec.replace.items())]
    return tuple(found)


def files_digest(team: LoadedTeam) -> str:
    """The team's files as the image gets them: each entry's destination, relative path, mode and content, in order."""
    digest = hashlib.sha256()
    for copy in team.spec.files:
        source = team.root / copy.src
        entries = sorted(p for p in source.rglob("*") if p.is_file() and not _ignored(p)) if source.is_dir() else [source]
        for path in entries:
            relative = path.relative_to(source).as_posix() if source.is_dir() else path.name
            digest.update(f"{copy.dest}\0{relative}\0{path.stat().st_mode & 0o777:o}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _ignored(path: Path) -> bool:
    return any(part in ("__pycache__", ".git") for part in path.parts) or path.suffix == ".pyc"


def version_label(team: LoadedTeam, locks: str, files_sha256: str) -> str:
    """What names the image (its version label, and so its tag): its locks (:func:`naming_locks`), its files and its team
    file (the environment and labels it sets)."""
    digest = hashlib.sha256(f"{locks}\n{files_sha256}\n{team.text}".encode()).hexdigest()
    return f"team-{team.spec.name.replace('/', '-')}-{digest[:12]}"


def naming_locks(team: LoadedTeam, arch: str, lock_sha256: str) -> str:
    """The locks that name the team's image for ``arch`` (``lock_sha256``: that arch's): that lock alone; for a team
    built for several arches (``arches:``), every one of theirs, in order, so that each arch's image has the one version
    its multi-arch index is published under. InputError (exit 1) when one is missing, or ``arch`` is not the team's."""
    arches = team.spec.arches
    if not arches:
        return lock_sha256
    if arch not in arches:
        raise InputError(f"{team.path}: the team builds for {', '.join(arches)} (arches:), not {arch}")
    found = []
    for each in arches:
        path = lock_file(team, each)
        if not path.is_file():
            error = InputError(
                f"{path} is missing: {team.path.name} builds for {', '.join(arches)}, and every arch's image is named by each "
                f"arch's lock: run `ascendkit team lock --arch {each}` first"
            )
            error.exit_code = ExitCode.CHECK_FAILED
            raise error
        found.append(hashlib.sha256(path.read_bytes()).hexdigest())
    return ",".join(found)


def _quote(value: str) -> str:
    return json.dumps(value)


def render_team_dockerfile(team: LoadedTeam, base: TeamBase, inputs: TeamBuildInputs) -> str:
    spec = team.spec
    lines = [
        f"# The team image {spec.name}: rendered by `ascendkit team build` from {team.path.name}. Do not edit.",
        "# Its base by digest, then only the team's layers: its locked packages, its files, its environment.",
        f"FROM {inputs.from_ref or inputs.base_ref}",
        f"ARG SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH}",
        "ARG TARGETARCH",
        *(f"ARG {arg}={url}" for arg, url in inputs.index_args),
        "ARG PIP_EXTRA_INDEX_URL=",
        f'ARG ASCENDKIT_ARCHES="{base.arch}"',
        f'ARG ASCENDKIT_EXTRA_INDEXES_{base.arch}="{" ".join(inputs.extra_index_args)}"',
        "ARG ASCENDKIT_INSTALLER=uv",
        "USER 0:0",
        "",
    ]
    if TEAM_LAYER in inputs.layers:
        released = sorted(canonicalize_name(name) for name in spec.replace)
        lines += [
            "# 1. The team's packages: its lock, every hash enforced, every base package held by the base's own sections"
            + (f"\n#    (but {', '.join(released)}, which the team file's replace: lets move, with its reason)." if released else "."),
            f"COPY {CONTEXT_LOCKS}/{TEAM_LAYER}-{base.arch}.txt /etc/ascendkit/locks/",
            "RUN --mount=type=cache,id=ascendkit-pip-${TARGETARCH},target=/var/cache/ascendkit,sharing=locked \\",
            "    --mount=type=secret,id=ascendkit-ca --mount=type=secret,id=ascendkit-env \\",
            "    set -eux; \\",
            "    . /usr/local/lib/ascendkit/build-env.sh; \\",
            *_released(team, base),
            f"    ascendkit_install {TEAM_LAYER}" + ("; \\" if team.spec.replace else ""),
            *(["    cp -p /tmp/ascendkit-held/* /etc/ascendkit/locks/; rm -rf /tmp/ascendkit-held"] if team.spec.replace else []),
            "",
        ]
    if inputs.fork_pin:
        dist = inputs.fork_pin.split("==")[0]
        section = f"/etc/ascendkit/locks/{FORK_LAYER}-{base.arch}.txt"
        replaced = f"/etc/ascendkit/locks/{base.framework}-{base.arch}.txt"
        lines += [
            f"# 2. The team's framework fork ({inputs.fork_source}), replacing the base's {base.framework}: its wheel by hash,",
            "#    no dependencies (its requirements came with the team's packages); the base's section for it is set aside.",
            f"COPY {CONTEXT_WHEELS}/ {IMAGE_WHEELS}/",
            f"COPY {CONTEXT_LOCKS}/{FORK_LAYER}-{base.arch}.txt /etc/ascendkit/locks/",
            "RUN set -eux; \\",
            "    mkdir -p /etc/ascendkit/locks/replaced; \\",
            f"    if [ -e {replaced} ]; then mv {replaced} /etc/ascendkit/locks/replaced/; fi; \\",
            f"    sed -i '/^{dist}==/d' /etc/ascendkit/constraints.txt; \\",
            '    python3 -m uv pip install --python "$(command -v python3)" --no-config --no-cache --link-mode=copy --compile-bytecode \\',
            f"      --require-hashes --no-deps --no-index --find-links {IMAGE_WHEELS} --reinstall-package {dist} -r {section}; \\",
            f"    printf '%s\\n' {inputs.fork_pin} >> /etc/ascendkit/constraints.txt",
            "",
        ]
    if spec.files:
        lines += ["# 3. The team's files (code, recipes, reward functions): the layer a code change rebuilds."]
        lines += [f"COPY --chown=0:0 {CONTEXT_FILES}/{index}/ {copy.dest}" for index, copy in enumerate(spec.files)]
    if spec.env:
        lines += ["", "ENV \\", " \\\n".join(f"    {name}={_quote(value)}" for name, value in sorted(spec.env.items()))]
    lines += ["", "LABEL \\", " \\\n".join(f"    {name}={_quote(value)}" for name, value in labels(team, base, inputs))]
    lines += [f"USER {inputs.base_user}" if inputs.base_user else "USER 0:0", ""]
    return "\n".join(lines)


def _released(team: LoadedTeam, base: TeamBase) -> list[str]:
    """The shell lines that let the packages ``replace:`` names move, for the team's install only: each base section
    set aside and given to the installer without their entries (every other pin still holds), the exact pins of
    /etc/ascendkit/constraints.txt without them (the team's versions are appended as it installs them, so doctor's
    pinned-packages check holds the new ones); the base's sections are put back as they were after the install."""
    names = sorted(canonicalize_name(name) for name in team.spec.replace)
    if not names:
        return []
    team_section = f"/etc/ascendkit/locks/{TEAM_LAYER}-{base.arch}.txt"
    drop = (  # an entry is its NAME==VERSION line and the continuation lines after it (hashes, comments)
        f'awk -v names=\' {" ".join(names)} \' \'!cont {{ n = tolower($0); sub(/==.*/, "", n); gsub(/[-_.]+/, "-", n); '
        'drop = ($0 ~ /^[A-Za-z0-9][A-Za-z0-9._-]*==/) && index(names, " " n " ") } !drop { print } { cont = /\\\\$/ }\''
    )
    pattern = "|".join(re.escape(name).replace("\\-", "[-_.]") for name in names)
    return [
        "    mkdir /tmp/ascendkit-held; \\",
        f"    for section in /etc/ascendkit/locks/*-{base.arch}.txt; do \\",
        f'      if [ "$section" = {team_section} ]; then continue; fi; \\',
        '      cp -p "$section" /tmp/ascendkit-held/; \\',
        f'      {drop} "/tmp/ascendkit-held/${{section##*/}}" > "$section"; \\',
        "    done; \\",
        f"    sed -i -E '/^({pattern})==/Id' /etc/ascendkit/constraints.txt; \\",
    ]


def classic(dockerfile: str) -> str:
    """The same steps for the classic builder: no cache or secret mounts (its RUN has no --mount)."""
    return dockerfile.replace(
        "RUN --mount=type=cache,id=ascendkit-pip-${TARGETARCH},target=/var/cache/ascendkit,sharing=locked \\\n"
        "    --mount=type=secret,id=ascendkit-ca --mount=type=secret,id=ascendkit-env \\\n",
        "RUN \\\n",
    )


def write_team_context(team: LoadedTeam, base: TeamBase, dockerfile: str, context: Path) -> None:
    """The build context: the Dockerfile, the team's lock as a base-style section, each file tree under its index."""
    (context / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    locks = context / CONTEXT_LOCKS
    locks.mkdir(parents=True)
    for layer, text in lock_sections(lock_file(team, base.arch).read_text(encoding="utf-8")).items():
        (locks / f"{layer}-{base.arch}.txt").write_text(text, encoding="utf-8")
    if team.spec.framework is not None:
        shutil.copytree(team.root / WHEELS_DIR, context / CONTEXT_WHEELS)
    for index, copy in enumerate(team.spec.files):
        source, target = team.root / copy.src, context / CONTEXT_FILES / str(index)
        if source.is_dir():
            shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))
        else:
            target.mkdir(parents=True)
            shutil.copy2(source, target / source.name)
