"""``ascendkit lock``: every Python package of an image, pinned with hashes, per stack and arch.

One uv resolution per (stack, arch), for the target's platform and CPython rather than the host's
(``uv pip compile --python-platform --python-version --generate-hashes``). Its inputs: the stack's
pins, one input file per pip layer of the image; the build requirements of the components built
from source; the stack's constraints and overrides; the indexes the matrix assigns.

vllm and vllm-ascend are installed from their sdists. uv cannot build those for another platform
to learn their dependencies, so ascendkit downloads each sdist (checked against the index's
sha256), reads the requirement file its setup.py installs from (vllm with
``VLLM_TARGET_DEVICE=empty``: ``requirements/common.txt``) and its ``[build-system] requires``,
and hands uv the first as static metadata; the second becomes the lock's ``build`` layer, which the
image installs before building those sdists without isolation.

The resolution is split by layer (each package goes to the first layer whose pins need it) and
written as a pip requirements file with a header: the sha256 of the matrix inputs it came from
(``render --check`` compares it), the status, and per package its hashes and the index it came
from. A target whose index cannot be reached gets a lock marked ``unresolved`` with the reason, so
the gap is written down and checked for staleness like any other lock, never silently filled.
"""

from __future__ import annotations

import email.parser
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from buildkit.errors import AscendkitError, ExitCode, InputError
from buildkit.fsio import write_atomic
from buildkit.matrix import LoadedMatrix
from buildkit.model import ARCHES, Arch, Stack
from buildkit.pkgindex import HashMismatch, IndexClient, IndexUnreachable, ProjectMissing, download, installable, target_tags
from buildkit.render import BUILD_LAYER, PRIMARY_INDEX, dist_name, install_layers, lock_layers, lock_path, section_path
from buildkit.secrets import split_credentials
from buildkit.settings import Mirrors

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

LOCK_FORMAT = 1
# The oldest glibc among the base OSes (Ubuntu 22.04: 2.35), so no locked wheel needs a newer one.
GLIBC = "2_35"
# Where a source-built component's runtime requirements live in its sdist, first match wins: vllm
# >= 0.8 (requirements/common.txt with VLLM_TARGET_DEVICE=empty), vllm 0.7, vllm-ascend. Without
# one, the sdist's PKG-INFO Requires-Dist.
REQUIREMENT_FILES = ("requirements/common.txt", "requirements-common.txt", "requirements.txt")
# pip's build requirements for an sdist that declares none (PEP 517 fallback for setup.py).
LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
UV_TIMEOUT_S = 600


class LockFailed(AscendkitError):
    """The pins do not resolve together, or the resolution breaks a rule of the matrix."""

    exit_code = ExitCode.CHECK_FAILED


@dataclass(frozen=True)
class LockTarget:
    stack_id: str
    arch: Arch

    @property
    def path(self) -> str:
        return lock_path(self.stack_id, self.arch)

    @property
    def name(self) -> str:
        return f"{self.stack_id}-{self.arch}"


def _canon(name: str) -> str:
    return str(canonicalize_name(name))


def python_platform(arch: str) -> str:
    return f"{arch}-manylinux_{GLIBC}"


@dataclass(frozen=True)
class LockInputs:
    """Everything from the matrix a lock depends on; its digest goes into the lock's header."""

    target: LockTarget
    python: str
    layers: tuple[tuple[str, tuple[str, ...]], ...]  # (layer, pinned requirements), in build order
    source_builds: tuple[tuple[str, str], ...]  # (dist, version) installed from the sdist
    constraints: tuple[str, ...]
    overrides: tuple[str, ...]
    indexes: tuple[tuple[str, str], ...]  # (name, matrix URL): the primary first, then the extras
    assigned: tuple[tuple[str, str], ...]  # (dist, index name) for every pin
    triton_ascend: str = ""  # the triton-ascend pin's dist, when the stack has one (the CUDA triton must stay out)
    order: tuple[str, ...] = ()  # every pip layer of the image in build order, the pinless build layer included

    @property
    def platform(self) -> str:
        return python_platform(self.target.arch)

    def digest(self) -> str:
        data = {
            "format": LOCK_FORMAT,
            "stack": self.target.stack_id,
            "arch": self.target.arch,
            "python": self.python,
            "platform": self.platform,
            "layers": self.layers,
            "source_builds": self.source_builds,
            "constraints": self.constraints,
            "overrides": self.overrides,
            "indexes": self.indexes,
            "assigned": self.assigned,
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @property
    def pinned(self) -> dict[str, str]:
        """Canonical dist name -> exact version, for every pin of the stack."""
        result = {}
        for _, requirements in self.layers:
            for requirement in requirements:
                name, _, version = requirement.partition("==")
                result[_canon(name)] = version
        return result


def lock_targets(loaded: LoadedMatrix, stack: str | None = None, arch: str | None = None) -> list[LockTarget]:
    """Every (stack, arch) the matrix supports, narrowed by ``--stack`` / ``--arch``."""
    stacks = loaded.matrix.stacks
    if stack is not None and stack not in stacks:
        raise InputError(f"unknown --stack {stack!r}; the matrix has: {', '.join(stacks)}")
    if arch is not None and arch not in ARCHES:
        raise InputError(f"unknown --arch {arch!r}; choose one of: {', '.join(ARCHES)}")
    targets = []
    for stack_id, st in stacks.items():
        if stack is not None and stack_id != stack:
            continue
        for a in st.arches:
            if arch is None or a == arch:
                targets.append(LockTarget(stack_id, a))
    if not targets:
        raise InputError(f"stack {stack!r} is not built for --arch {arch!r}")
    return targets


def lock_inputs(loaded: LoadedMatrix, target: LockTarget) -> LockInputs:
    matrix = loaded.matrix
    stack: Stack = matrix.stacks[target.stack_id]
    layers = tuple((layer, tuple(p.requirement for p in pins)) for layer, pins in install_layers(stack) if pins)
    dists = {p.dist: p for _, pins in install_layers(stack) for p in pins}
    assigned = []
    for component, pin in stack.pins().items():
        assigned.append((_pin_dist(stack, component), pin.index_for(target.arch)))
    used = sorted({index for _, index in assigned} - {PRIMARY_INDEX})
    constraints = {**stack.constraints, **stack.constraints_by_arch.get(target.arch, {})}
    return LockInputs(
        target=target,
        python=stack.python,
        layers=layers,
        source_builds=tuple((p.dist, p.version) for p in dists.values() if p.from_source),
        constraints=tuple(f"{name}{spec}" for name, spec in sorted(constraints.items())),
        overrides=tuple(f"{name}{spec}" for name, spec in sorted(stack.overrides.items())),
        indexes=tuple((name, matrix.indexes[name].url) for name in [PRIMARY_INDEX, *used]),
        assigned=tuple(sorted(assigned)),
        triton_ascend=_pin_dist(stack, "triton_ascend"),
        order=tuple(lock_layers(stack)),
    )


def _pin_dist(stack: Stack, component: str) -> str:
    pin = stack.pins().get(component)
    return "" if pin is None else _canon(pin.package or dist_name(component))


# --- reading sdists -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceMetadata:
    """What an sdist says it needs, read without building it."""

    dist: str
    version: str
    filename: str
    sha256: str
    requires_from: str  # the file the runtime requirements were read from
    requires: tuple[str, ...]
    build_requires: tuple[str, ...]


class _Archive:
    """Read members of an sdist (.tar.gz or .zip) by their path below its top directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.members: dict[str, bytes] = {}
        wanted = re.compile(r"^[^/]+/(requirements[^/]*\.txt|requirements/[^/]+\.txt|pyproject\.toml|PKG-INFO)$")
        if path.name.endswith(".zip"):
            with zipfile.ZipFile(path) as archive:
                for name in archive.namelist():
                    if wanted.match(name):
                        self.members[name.split("/", 1)[1]] = archive.read(name)
        else:
            with tarfile.open(path, "r:*") as archive:
                for member in archive:
                    if member.isfile() and wanted.match(member.name):
                        handle = archive.extractfile(member)
                        if handle is not None:
                            self.members[member.name.split("/", 1)[1]] = handle.read()

    def text(self, name: str) -> str | None:
        data = self.members.get(name)
        return None if data is None else data.decode("utf-8", errors="replace")


def _requirement_lines(archive: _Archive, name: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """Requirements of one requirements file in the sdist, following ``-r`` includes."""
    text = archive.text(name)
    if text is None:
        raise InputError(f"{archive.path.name}: {name} is included but not in the sdist")
    result: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        if line.startswith(("-r ", "--requirement ")):
            include = str(PurePosixPath(name).parent / line.split(None, 1)[1])
            include = os.path.normpath(include)
            if include in seen:
                continue
            result += _requirement_lines(archive, include, seen | {name})
            continue
        if line.startswith("-"):
            continue  # index options (--extra-index-url, --pre): the matrix decides indexes
        try:
            Requirement(line)
        except InvalidRequirement as exc:
            raise InputError(f"{archive.path.name}: {name} line {number}: not a requirement: {line!r} ({exc})") from None
        result.append(line)
    return result


def read_sdist(path: Path, dist: str, version: str, sha256: str) -> SourceMetadata:
    archive = _Archive(path)
    requires_from = next((name for name in REQUIREMENT_FILES if name in archive.members), "")
    if requires_from:
        requires = _requirement_lines(archive, requires_from)
    else:
        info = email.parser.Parser().parsestr(archive.text("PKG-INFO") or "")
        requires = list(info.get_all("Requires-Dist") or [])
        requires_from = "PKG-INFO"
    pyproject = archive.text("pyproject.toml")
    build_requires: list[str] = list(LEGACY_BUILD_REQUIRES)
    if pyproject is not None:
        try:
            data = tomllib.loads(pyproject)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{path.name}: pyproject.toml: {exc}") from None
        system = data.get("build-system", {})
        if isinstance(system, dict) and isinstance(system.get("requires"), list):
            build_requires = [str(r) for r in system["requires"]]
    for requirement in build_requires:
        try:
            Requirement(requirement)
        except InvalidRequirement as exc:
            raise InputError(f"{path.name}: pyproject.toml [build-system] requires: {requirement!r}: {exc}") from None
    return SourceMetadata(dist, version, path.name, sha256, requires_from, tuple(requires), tuple(build_requires))


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ascendkit" / "sdists"


class SdistReader:
    """Downloads (once per process, and once per machine via the cache) and reads sdists."""

    def __init__(self, client: IndexClient, cache: Path | None = None) -> None:
        self.client = client
        self.cache = cache or cache_dir()
        self._done: dict[tuple[str, str, str], SourceMetadata | AscendkitError | IndexUnreachable] = {}
        self._lock = threading.Lock()
        self._fetching: dict[tuple[str, str, str], threading.Lock] = {}

    def metadata(self, index_url: str, dist: str, version: str) -> SourceMetadata:
        key = (index_url, _canon(dist), version)
        with self._lock:
            gate = self._fetching.setdefault(key, threading.Lock())
        with gate:
            if key not in self._done:
                try:
                    self._done[key] = self._fetch(index_url, dist, version)
                except (AscendkitError, IndexUnreachable) as exc:
                    self._done[key] = exc
        result = self._done[key]
        if isinstance(result, Exception):
            raise result
        return result

    def _fetch(self, index_url: str, dist: str, version: str) -> SourceMetadata:
        try:
            project = self.client.project(index_url, dist)
        except ProjectMissing:
            raise LockFailed(f"{dist}=={version} is built from source, but {_public(index_url)} has no project {dist}") from None
        sdists = [f for f in project.files if f.kind == "sdist" and str(f.version) == version and not f.yanked]
        if not sdists:
            raise LockFailed(f"{dist}=={version} is built from source, but {_public(index_url)} has no sdist of that version")
        sdist = sorted(sdists, key=lambda f: (not f.filename.endswith(".tar.gz"), f.filename))[0]
        if not sdist.sha256:
            raise LockFailed(f"{sdist.filename}: {_public(index_url)} publishes no sha256 for it; it cannot be locked")
        path = self.cache / sdist.sha256 / sdist.filename
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                download(self.client.session, sdist.url, path, frozenset({sdist.sha256}))
            except HashMismatch as exc:
                raise LockFailed(f"{_public(index_url)}: {exc}") from None
        return read_sdist(path, dist, version, sdist.sha256)


def _public(url: str) -> str:
    return split_credentials(url)[0]


# --- resolving ------------------------------------------------------------------------------------


@dataclass
class LockedPackage:
    name: str  # as uv prints it
    version: str
    hashes: list[str] = field(default_factory=list)  # "sha256:..."
    via: list[str] = field(default_factory=list)
    source: str = ""  # index URL the package was resolved from

    @property
    def key(self) -> str:
        return _canon(self.name)


_PACKAGE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\\;]+)")


def parse_uv_output(text: str) -> list[LockedPackage]:
    """Packages of ``uv pip compile --generate-hashes --emit-index-annotation`` output."""
    packages: list[LockedPackage] = []
    in_via = False
    for line in text.splitlines():
        stripped = line.strip().rstrip("\\").strip()
        if not stripped:
            continue
        if not line[0].isspace():
            match = _PACKAGE_LINE.match(stripped)
            if match:
                packages.append(LockedPackage(match.group(1), match.group(2)))
            in_via = False
            continue
        if not packages:
            continue
        current = packages[-1]
        if stripped.startswith("--hash="):
            current.hashes.append(stripped.removeprefix("--hash="))
            in_via = False
        elif stripped == "# via":
            in_via = True
        elif stripped.startswith("# via "):
            current.via.append(stripped.removeprefix("# via ").strip())
            in_via = False
        elif stripped.startswith("# from "):
            current.source = stripped.removeprefix("# from ").strip()
            in_via = False
        elif in_via and stripped.startswith("#   "):
            current.via.append(stripped.removeprefix("#").strip())
    return packages


def assign_layers(packages: list[LockedPackage], layer_files: dict[str, str]) -> dict[str, list[LockedPackage]]:
    """Split a resolution by layer: each package goes to the first layer whose roots need it.

    ``layer_files`` maps each layer to the input file its roots came from (what ``# via -r FILE``
    names); dependency edges come from the other ``# via`` entries.
    """
    by_key = {p.key: p for p in packages}
    children: dict[str, set[str]] = {key: set() for key in by_key}
    roots: dict[str, set[str]] = {layer: set() for layer in layer_files}
    file_layer = {name: layer for layer, name in layer_files.items()}
    for package in packages:
        for parent in package.via:
            if parent.startswith("-r "):
                layer = file_layer.get(PurePosixPath(parent[3:].strip()).name)
                if layer is not None:
                    roots[layer].add(package.key)
            elif not parent.startswith("-"):
                parent_key = _canon(re.sub(r"\[.*$", "", parent.split()[0]))
                if parent_key in children:
                    children[parent_key].add(package.key)
    placed: dict[str, str] = {}
    for layer in layer_files:
        queue = sorted(roots[layer])
        while queue:
            key = queue.pop()
            if key in placed:
                continue
            placed[key] = layer
            queue += sorted(children[key] - placed.keys())
    orphans = sorted(set(by_key) - placed.keys())
    if orphans:
        raise LockFailed(f"the resolution has packages no layer asks for: {', '.join(orphans)}")
    return {layer: sorted((p for p in packages if placed[p.key] == layer), key=lambda p: p.key) for layer in layer_files}


@dataclass(frozen=True)
class Resolution:
    layers: dict[str, list[LockedPackage]]
    sources: tuple[SourceMetadata, ...]
    resolver: str


def _toml_array(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def uv_binary() -> str:
    """The uv executable installed with ascendkit (the PyPI wheel ships it)."""
    candidate = Path(sys.executable).with_name("uv")
    if candidate.is_file():
        return str(candidate)
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise InputError("uv is not installed; `pip install uv` (it is a dependency of ascendkit)") from None
    return str(find_uv_bin())


@functools.lru_cache(maxsize=1)
def uv_version() -> str:
    """``uv X.Y.Z``, without the build triple (the lock must not depend on the host)."""
    done = subprocess.run([uv_binary(), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.split("(")[0].strip() or "uv (unknown version)"


def resolve(
    inputs: LockInputs,
    sources: list[SourceMetadata],
    index_urls: dict[str, str],
    *,
    ca_bundle: Path | None = None,
    previous: str | None = None,
    client: IndexClient | None = None,
) -> Resolution:
    """Run uv for one target and split the result by layer. ``index_urls`` maps each index name to
    the URL to use (a mirror, maybe with credentials); ``previous`` is the current lock's text,
    whose versions uv keeps where they still fit (``ascendkit lock --upgrade`` passes None)."""
    pinned = inputs.pinned
    layer_requirements = dict(inputs.layers)
    build: list[str] = []
    for meta in sources:
        for requirement in meta.build_requires:
            name = _canon(Requirement(requirement).name)
            if name not in pinned and requirement not in build:
                build.append(requirement)  # a pinned package builds against its pin (no isolation)
    with tempfile.TemporaryDirectory(prefix="ascendkit-lock-") as tmp:
        work = Path(tmp)
        layer_files = {}
        for number, layer in enumerate(inputs.order, start=1):
            requirements = build if layer == BUILD_LAYER else list(layer_requirements.get(layer, ()))
            if not requirements:
                continue  # the build layer, when every build requirement is a pin of the stack
            filename = f"{number:02d}-{layer}.in"
            (work / filename).write_text("".join(f"{r}\n" for r in requirements), encoding="utf-8")
            layer_files[layer] = filename
        (work / "constraints.txt").write_text("".join(f"{c}\n" for c in inputs.constraints), encoding="utf-8")
        (work / "overrides.txt").write_text("".join(f"{o}\n" for o in inputs.overrides), encoding="utf-8")
        config = "".join(
            f'[[dependency-metadata]]\nname = "{m.dist}"\nversion = "{m.version}"\nrequires-dist = {_toml_array(m.requires)}\n\n'
            for m in sources
        )
        (work / "uv.toml").write_text(config, encoding="utf-8")
        out = work / "lock.txt"
        if previous:
            out.write_text(_pip_requirements(previous), encoding="utf-8")
        primary, *extras = [name for name, _ in inputs.indexes]
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        env["UV_INDEX_URL"] = index_urls[primary]
        env["UV_EXTRA_INDEX_URL"] = " ".join(index_urls[name] for name in extras)
        if ca_bundle is not None:
            env["SSL_CERT_FILE"] = str(ca_bundle)
        command = [
            uv_binary(),
            "pip",
            "compile",
            "--quiet",
            "--config-file",
            "uv.toml",
            *layer_files.values(),
            "--constraint",
            "constraints.txt",
            "--override",
            "overrides.txt",
            "--python-platform",
            inputs.platform,
            "--python-version",
            inputs.python,
            "--generate-hashes",
            "--emit-index-annotation",
            "--annotation-style",
            "split",
            "--no-header",
            "--output-file",
            out.name,
        ]
        for dist, _ in inputs.source_builds:
            command += ["--no-binary", dist]
        try:
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=UV_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise LockFailed(f"{inputs.target.name}: uv did not finish in {UV_TIMEOUT_S} s") from None
        if done.returncode != 0:
            message = _redact(done.stderr.strip() or done.stdout.strip(), index_urls.values())
            raise LockFailed(
                f"{inputs.target.name}: the pins do not resolve together for {inputs.platform}, Python {inputs.python}:\n{message}"
            )
        packages = parse_uv_output(out.read_text(encoding="utf-8"))
    used = [(name, _public(index_urls[name]).rstrip("/")) for name, _ in inputs.indexes]
    assigned = {_canon(dist): name for dist, name in inputs.assigned}
    for package in packages:
        url = _public(package.source).rstrip("/")
        candidates = [name for name, u in used if u == url]
        if assigned.get(package.key) in candidates:
            package.source = assigned[package.key]
        elif candidates:
            package.source = candidates[0]
        else:
            package.source = url  # not an index of this target: _check reports it for a pin
    _check(inputs, packages)
    sdists = {_canon(m.dist): f"sha256:{m.sha256}" for m in sources}
    for package in packages:
        if package.key in sdists:
            if sdists[package.key] not in package.hashes:
                raise LockFailed(f"{inputs.target.name}: uv's hashes for {package.name}=={package.version} lack its sdist's")
            package.hashes = [sdists[package.key]]  # built from source: only the sdist may be installed
    if client is not None:
        _keep_target_files(client, packages, index_urls, inputs)
    layers = assign_layers(packages, layer_files)
    pins_of = {f"-r {name}": f"pins of layer {layer}" for layer, name in layer_files.items()}
    for package in packages:
        package.via = [pins_of.get(v, v) for v in package.via]
    return Resolution(layers, tuple(sources), uv_version())


def _keep_target_files(client: IndexClient, packages: list[LockedPackage], index_urls: dict[str, str], inputs: LockInputs) -> None:
    """Keep only the hashes of files the target can install: its wheels, or the sdist when no wheel
    fits (uv lists every file of the version, for every platform)."""
    tags = target_tags(inputs.target.arch, inputs.python)

    def keep(package: LockedPackage) -> None:
        if len(package.hashes) <= 1 or package.source not in index_urls:
            return
        try:
            project = client.project(index_urls[package.source], package.name)
        except (IndexUnreachable, ProjectMissing):
            return  # keep uv's list: every hash in it is a real file of this version
        files = [f for f in project.files if str(f.version) == package.version and f.sha256 and installable(f, tags, inputs.python)]
        wheels = {f"sha256:{f.sha256}" for f in files if f.kind == "wheel"}
        chosen = wheels or {f"sha256:{f.sha256}" for f in files}
        narrowed = [h for h in package.hashes if h in chosen]
        if narrowed:
            package.hashes = narrowed

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(keep, packages))


def _redact(text: str, urls: object) -> str:
    for url in urls:  # type: ignore[attr-defined]
        public, full = split_credentials(str(url))
        if full:
            text = text.replace(full, public)
    return text


def _check(inputs: LockInputs, packages: list[LockedPackage]) -> None:
    """Rules the resolution must keep: pins unchanged, pins from their assigned index, no CUDA triton."""
    found = {p.key: p for p in packages}
    problems = []
    for dist, version in inputs.pinned.items():
        package = found.get(dist)
        if package is None or package.version != version:
            problems.append(f"{dist}=={version} resolved as {package.version if package else 'nothing'}")
    for dist, index in inputs.assigned:
        package = found.get(_canon(dist))
        if package is not None and package.source != index:
            problems.append(f"{dist} came from {package.source or 'an unknown index'}, but the matrix assigns it to {index}")
    if inputs.triton_ascend and "triton" in found:
        problems.append(
            f"triton=={found['triton'].version} (the CUDA build, pulled in by {', '.join(found['triton'].via)}) "
            "would overwrite triton-ascend's files: pin or constrain what pulls it in"
        )
    if problems:
        raise LockFailed(f"{inputs.target.name}: " + "; ".join(problems))


# --- the lock file --------------------------------------------------------------------------------


def _pip_requirements(text: str) -> str:
    """A lock's package lines only (what uv reads back as preferences)."""
    return "".join(line + "\n" for line in text.splitlines() if line and not line.startswith("#"))


def render_lock(inputs: LockInputs, resolution: Resolution) -> str:
    target = inputs.target
    total = sum(len(p) for p in resolution.layers.values())
    lines = _header(inputs, "resolved")
    lines.append(f"# resolver: {resolution.resolver}")
    for name, url in inputs.indexes:
        lines.append(f"# index {name}: {url}")
    for override in inputs.overrides:
        lines.append(f"# override: {override}")
    for meta in resolution.sources:
        lines.append(
            f"# source build: {meta.dist}=={meta.version} from {meta.filename} (sha256:{meta.sha256}); "
            f"requirements from {meta.requires_from}, build requirements from "
            f"{'pyproject.toml' if meta.build_requires != LEGACY_BUILD_REQUIRES else 'the setuptools default'}"
        )
    lines.append(f"# packages: {total}")
    for layer, packages in resolution.layers.items():
        lines += ["", f"# layer: {layer}"]
        for package in packages:
            hashes = [f"    --hash={h}" for h in sorted(package.hashes)]
            if not hashes:
                raise LockFailed(f"{target.name}: uv gave no hash for {package.name}=={package.version}")
            lines.append(f"{package.key}=={package.version} \\")
            lines += [h + " \\" for h in hashes[:-1]] + [hashes[-1]]
            lines.append(f"    # index: {package.source}")
            lines.append(f"    # via: {', '.join(sorted(package.via))}")
    return "\n".join(lines) + "\n"


def render_unresolved(inputs: LockInputs, reason: str) -> str:
    lines = _header(inputs, "unresolved")
    lines.append(f"# reason: {reason}")
    for name, url in inputs.indexes:
        lines.append(f"# index {name}: {url}")
    lines.append("# The image installs this arch by version pins, without hash checks, until this lock is resolved.")
    return "\n".join(lines) + "\n"


def _header(inputs: LockInputs, status: str) -> list[str]:
    target = inputs.target
    return [
        f"# ascendkit lock: stack {target.stack_id} on {target.arch} ({inputs.platform}, CPython {inputs.python}).",
        "# Every Python package of the image, with the hashes pip enforces. Do not edit: run",
        f"# `ascendkit lock --stack {target.stack_id} --arch {target.arch}`; `ascendkit render --check` fails when it is stale.",
        f"# format: {LOCK_FORMAT}",
        f"# inputs-sha256: {inputs.digest()}",
        f"# status: {status}",
    ]


@dataclass(frozen=True)
class LockFile:
    path: Path
    header: dict[str, str]
    layers: dict[str, list[LockedPackage]]
    source_builds: frozenset[str] = frozenset()  # canonical names installed from their sdist

    @property
    def resolved(self) -> bool:
        return self.header.get("status") == "resolved"

    @property
    def packages(self) -> list[tuple[str, LockedPackage]]:
        return [(layer, p) for layer, packages in self.layers.items() for p in packages]


def read_lock(path: Path) -> LockFile:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such lock; run `ascendkit lock`") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    header: dict[str, str] = {}
    layers: dict[str, list[LockedPackage]] = {}
    layer = ""
    current: LockedPackage | None = None
    sources: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("# layer: "):
            layer = line.removeprefix("# layer: ").strip()
            layers[layer] = []
            current = None
        elif not layers and line.startswith("# ") and ": " in line:
            key, _, value = line[2:].partition(": ")
            header.setdefault(key.strip(), value.strip())
            if key == "source build":
                sources.add(_canon(value.split("==", 1)[0]))
        elif line and not line[0].isspace() and not line.startswith("#"):
            match = _PACKAGE_LINE.match(line)
            if match is None or not layer:
                raise InputError(f"{path}:{number}: not a locked requirement: {line!r}")
            current = LockedPackage(match.group(1), match.group(2))
            layers[layer].append(current)
        elif current is not None:
            stripped = line.strip().rstrip("\\").strip()
            if stripped.startswith("--hash="):
                current.hashes.append(stripped.removeprefix("--hash="))
            elif stripped.startswith("# index: "):
                current.source = stripped.removeprefix("# index: ")
            elif stripped.startswith("# via: "):
                current.via = [v for v in stripped.removeprefix("# via: ").split(", ") if v]
    if "inputs-sha256" not in header or "status" not in header:
        raise InputError(f"{path}: not an ascendkit lock (no inputs-sha256/status header)")
    return LockFile(path, header, layers, frozenset(sources))


def section_texts(loaded: LoadedMatrix, target: LockTarget) -> dict[str, str]:
    """The per-layer files of a lock (path relative to the matrix's directory -> text), read from
    the lock on disk; empty when it is missing or unreadable (``lock_problem`` says why).

    A section holds only what pip needs (requirements, hashes, the index), never the ``via``
    notes: those name later layers, and a section must change only when its own packages do."""
    try:
        lock = read_lock(loaded.root / target.path)
    except InputError:
        return {}
    status = "resolved" if lock.resolved else "unresolved"
    texts = {}
    for layer in lock_layers(loaded.matrix.stacks[target.stack_id]):
        lines = [
            f"# ascendkit lock section: layer {layer} of {target.path} (generated by `ascendkit lock`; do not edit).",
            f"# status: {status}",
        ]
        for package in lock.layers.get(layer, []) if lock.resolved else []:
            hashes = [f"    --hash={h}" for h in package.hashes]
            lines.append(f"{package.key}=={package.version} \\")
            lines += [h + " \\" for h in hashes[:-1]] + [hashes[-1], f"    # index: {package.source}"]
        texts[section_path(target.stack_id, layer, target.arch)] = "\n".join(lines) + "\n"
    return texts


def write_sections(loaded: LoadedMatrix, target: LockTarget) -> list[str]:
    """Write the lock's per-layer files that changed; returns their paths."""
    written = []
    for relative, text in section_texts(loaded, target).items():
        path = loaded.root / relative
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        written.append(relative)
    return written


def lock_problem(root: Path, inputs: LockInputs) -> str | None:
    """Why the lock of ``inputs.target`` under ``root`` cannot be used as it is, or None."""
    path = root / inputs.target.path
    command = f"ascendkit lock --stack {inputs.target.stack_id} --arch {inputs.target.arch}"
    if not path.is_file():
        return f"{inputs.target.path} is missing: run `{command}`"
    try:
        lock = read_lock(path)
    except InputError as exc:
        return f"{exc}: run `{command}`"
    if lock.header.get("format") != str(LOCK_FORMAT) or lock.header.get("inputs-sha256") != inputs.digest():
        return f"{inputs.target.path} is stale: the matrix changed since it was made; run `{command}`"
    return None


# --- ascendkit lock -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockOutcome:
    target: LockTarget
    status: str  # "resolved", "unresolved", "failed"
    detail: str
    packages: int = 0
    changed: bool = False
    seconds: float = 0.0

    def describe(self) -> dict[str, object]:
        return {
            "stack": self.target.stack_id,
            "arch": self.target.arch,
            "lock": self.target.path,
            "status": self.status,
            "detail": self.detail,
            "packages": self.packages,
            "changed": self.changed,
            "seconds": round(self.seconds, 2),
        }


def _unreachable(client: IndexClient, inputs: LockInputs, index_urls: dict[str, str]) -> str | None:
    """The first index this target needs that does not answer, as a sentence; None if all answer."""
    probes = {index: dist for dist, index in inputs.assigned}
    for name, _ in inputs.indexes:
        try:
            client.project(index_urls[name], probes.get(name, "pip"))
        except IndexUnreachable as exc:
            return f"index {name} ({_public(index_urls[name])}) could not be reached: {exc}"
        except ProjectMissing:
            pass  # it answered; a missing pin is reported by the resolution
    return None


def lock_one(
    loaded: LoadedMatrix,
    target: LockTarget,
    *,
    client: IndexClient,
    reader: SdistReader,
    index_urls: dict[str, str],
    ca_bundle: Path | None = None,
    upgrade: bool = False,
    write: bool = True,
) -> LockOutcome:
    started = time.monotonic()
    inputs = lock_inputs(loaded, target)
    path = loaded.root / target.path
    old = path.read_text(encoding="utf-8") if path.is_file() else None
    try:
        reason = _unreachable(client, inputs, index_urls)
        if reason is not None:
            text, status, detail, count = render_unresolved(inputs, reason), "unresolved", reason, 0
        else:
            sources = [reader.metadata(index_urls[_index_of(inputs, dist)], dist, version) for dist, version in inputs.source_builds]
            previous = old if (old and not upgrade and "# status: resolved" in old) else None
            # narrowing hashes to the target's files costs an index query per package: only for a lock kept
            resolution = resolve(inputs, sources, index_urls, ca_bundle=ca_bundle, previous=previous, client=client if write else None)
            text, status, count = render_lock(inputs, resolution), "resolved", sum(len(p) for p in resolution.layers.values())
            detail = f"{count} packages"
    except IndexUnreachable as exc:
        reason = f"an index could not be reached: {exc}"
        text, status, detail, count = render_unresolved(inputs, reason), "unresolved", reason, 0
    except (LockFailed, InputError) as exc:
        return LockOutcome(target, "failed", str(exc), seconds=time.monotonic() - started)
    if status == "unresolved" and old is not None and lock_problem(loaded.root, inputs) is None and "\n# status: resolved\n" in old:
        # an index that is down today does not undo a resolution of these very inputs: keep it
        text, detail = old, f"{detail}; kept the current resolved lock"
    changed = text != old
    if write:
        if changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text)
        changed = bool(write_sections(loaded, target)) or changed
    return LockOutcome(target, status, detail, count, changed, time.monotonic() - started)


def _index_of(inputs: LockInputs, dist: str) -> str:
    return dict(inputs.assigned).get(dist, PRIMARY_INDEX)


def lock_all(
    loaded: LoadedMatrix,
    targets: list[LockTarget],
    *,
    index_urls: dict[str, str],
    ca_bundle: Path | None = None,
    upgrade: bool = False,
    jobs: int = 4,
    on_done: Callable[[LockOutcome], None] | None = None,
) -> list[LockOutcome]:
    """Lock every target, ``jobs`` at a time; outcomes in the order of ``targets``."""
    client = IndexClient(ca_bundle=ca_bundle)
    reader = SdistReader(client)

    def one(target: LockTarget) -> LockOutcome:
        outcome = lock_one(loaded, target, client=client, reader=reader, index_urls=index_urls, ca_bundle=ca_bundle, upgrade=upgrade)
        if on_done is not None:
            on_done(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, targets))


def index_urls_for(loaded: LoadedMatrix, mirrors: Mirrors) -> dict[str, str]:
    """Index name -> URL to use: the mirror given for it (flag, environment, config file), else the matrix's."""
    redirected = mirrors.build_args()
    return {name: redirected.get(index.arg) or index.url for name, index in loaded.matrix.indexes.items()}
