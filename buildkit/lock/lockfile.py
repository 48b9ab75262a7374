"""The lock file: writing it with its header, reading it back, its per-layer sections, staleness."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from buildkit.errors import InputError
from buildkit.fsio import write_atomic
from buildkit.lock.inputs import LEGACY_BUILD_REQUIRES, LOCK_FORMAT, LockFailed, LockInputs, LockTarget, canon, lock_inputs
from buildkit.matrix.load import LoadedMatrix
from buildkit.plan import section_path, stack_layers

if TYPE_CHECKING:
    from buildkit.lock.gitsource import CheckoutRequirements
    from buildkit.lock.sdist import SourceMetadata


@dataclass
class LockedPackage:
    name: str  # as uv prints it
    version: str
    hashes: list[str] = field(default_factory=list)  # "sha256:..."
    via: list[str] = field(default_factory=list)
    source: str = ""  # index URL the package was resolved from

    @property
    def key(self) -> str:
        return canon(self.name)


CHECKOUT_KEY = "source checkout"  # header: LAYER URL@COMMIT STORED-FILE sha256:HEX (its requirements, read at lock time)
PACKAGE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\\;]+)")


@dataclass(frozen=True)
class Resolution:
    layers: dict[str, list[LockedPackage]]
    sources: tuple[SourceMetadata, ...]
    resolver: str
    checkouts: tuple[CheckoutRequirements, ...] = ()


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
    for checkout in resolution.checkouts:
        lines.append(f"# {CHECKOUT_KEY}: {checkout.header_line()}")
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
        "# Every Python package of the image, with the hashes its installer (uv; pip with --installer pip) enforces. Do not edit: run",
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
    checkouts: tuple[str, ...] = ()  # the source checkout header lines: what each checkout's requirements were read from

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
    checkouts: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("# layer: "):
            layer = line.removeprefix("# layer: ").strip()
            layers[layer] = []
            current = None
        elif not layers and line.startswith("# ") and ": " in line:
            key, _, value = line[2:].partition(": ")
            header.setdefault(key.strip(), value.strip())
            if key == "source build":
                sources.add(canon(value.split("==", 1)[0]))
            elif key == CHECKOUT_KEY:
                checkouts.append(value.strip())
        elif line and not line[0].isspace() and not line.startswith("#"):
            match = PACKAGE_LINE.match(line)
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
    return LockFile(path, header, layers, frozenset(sources), tuple(checkouts))


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
    for layer in stack_layers(loaded.matrix.stacks[target.stack_id], loaded.matrix.installer).names:
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


def lock_state(loaded: LoadedMatrix, target: LockTarget) -> str:
    """resolved (hashes enforced), unresolved (pins only), missing or stale: what a build would meet."""
    if not (loaded.root / target.path).is_file():
        return "missing"
    if lock_problem(loaded.root, lock_inputs(loaded, target)) is not None:
        return "stale"
    return "resolved" if read_lock(loaded.root / target.path).resolved else "unresolved"


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
    for line in lock.checkouts:
        _, _, stored, digest = [*line.split(" "), "", "", "", ""][:4]
        try:
            text = (root / stored).read_text(encoding="utf-8")
        except OSError:
            return f"{inputs.target.path} was made from {stored}, which is missing: restore it, or run `{command}` to read it again"
        if f"sha256:{hashlib.sha256(text.encode('utf-8')).hexdigest()}" != digest:
            return f"{inputs.target.path} was made from another {stored} than the one there (its sha256 differs): run `{command}`"
    return None
