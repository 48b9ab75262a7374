"""Each stack held to the upstream images it stands for: verl's Ascend Dockerfiles, vendored in ``upstream/``.

A stack names its images (``upstream.images``); :func:`parities` reads each one with
:mod:`buildkit.matrix.upstream` and sets the stack beside it, component by component: the CANN base (version,
chip, OS, Python) and the pins both sides install. A component differs when the stack pins something other than
what the Dockerfile installs; upstream leaving it unpinned (verl from its main branch, a bare ``pip install
mbridge``) is shown, not counted: there is nothing to agree with. Every difference needs its reason in the
stack's ``upstream.differences``, and a reason with no difference left under it is stale: the test refuses
both, and ``docs/verl-parity.md`` shows it all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from buildkit.errors import InputError
from buildkit.matrix.load import LoadedMatrix
from buildkit.matrix.model import GitPin, PypiPin, Stack
from buildkit.matrix.sources import ParityComponent
from buildkit.matrix.upstream import UpstreamImage, UpstreamPin, read_dockerfile

UPSTREAM_DIR = "upstream"  # beside the matrix: the vendored files and SOURCES.json
COMPARED: tuple[str, ...] = get_args(ParityComponent)
Status = Literal["same", "differs", "unpinned upstream"]


@dataclass(frozen=True)
class Vendored:
    """The vendored upstream files: their text, where each came from, and the images read from them."""

    root: Path
    sources: dict[str, dict[str, Any]]

    @classmethod
    def load(cls, matrix_root: Path) -> Vendored:
        root = matrix_root / UPSTREAM_DIR
        index = root / "SOURCES.json"
        try:
            files = json.loads(index.read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError) as exc:
            raise InputError(f"{index}: cannot read the vendored upstream files' index: {exc}") from exc
        return cls(root, {entry["file"]: entry for entry in files})

    def text(self, file: str) -> str:
        if file not in self.sources:
            raise InputError(f"{self.root / 'SOURCES.json'}: {file} is not vendored (python -m tests.harness.upstream_files vendor)")
        return (self.root / file).read_text(encoding="utf-8")

    def requirements(self, repo: str, ref: str, name: str) -> tuple[str, str] | None:
        file = f"{repo}/{ref or 'main'}/{name}"
        return (file, self.text(file)) if file in self.sources else None

    def image(self, file: str) -> UpstreamImage:
        """What the Dockerfile ``file`` installs; a clone of its own repository without a branch gets the
        branch the Dockerfile was vendored from (its repository as of that Dockerfile)."""
        own = file.split("/", 1)[0]  # the repository the file was vendored from (verl, vllm-ascend)
        return read_dockerfile(file, self.text(file), self.requirements, default_ref=self.sources[file]["branch"], own_repo=own)

    def commit(self, file: str) -> str:
        """The git commit the file was vendored from; a file of a release archive names its release instead."""
        entry = self.sources[file]
        return str(entry.get("commit") or entry["branch"])

    def url(self, file: str) -> str:
        entry = self.sources[file]
        if "archive" in entry:  # vendored from a release's source archive (a PyPI sdist), not a git tree
            return str(entry["repository"])
        return f"{entry['repository']}/blob/{entry['commit']}/{entry['path']}"


@dataclass(frozen=True)
class Row:
    component: str
    theirs: str
    ours: str
    status: Status
    where: str
    reason: str | None  # the stack's reason, for a difference

    @property
    def unexplained(self) -> bool:
        return self.status == "differs" and self.reason is None


@dataclass(frozen=True)
class ImageParity:
    stack_id: str
    file: str
    image: UpstreamImage
    rows: tuple[Row, ...]

    @cached_property
    def differences(self) -> tuple[Row, ...]:
        return tuple(row for row in self.rows if row.status == "differs")


def _same_version(ours: str, pin: UpstreamPin) -> bool:
    try:
        mine = Version(ours)
        if pin.kind == "spec":
            return SpecifierSet(pin.value).contains(mine, prereleases=True)
        theirs = Version(pin.value)
    except (InvalidVersion, InvalidSpecifier):
        return ours == pin.value
    if pin.kind == "branch":  # a release branch: its release and the fix releases cut from it
        return mine.base_version == theirs.base_version
    return mine.public == theirs.public  # torch 2.9.0+cpu is torch 2.9.0


def _same_ref(ours: str, theirs: str) -> bool:
    return ours == theirs or (len(min(ours, theirs, key=len)) >= 7 and (ours.startswith(theirs) or theirs.startswith(ours)))


def _ours(stack: Stack, component: str) -> str | None:
    value = getattr(stack, component, None) if component in Stack.model_fields else stack.frameworks.get(component)
    if isinstance(value, PypiPin):
        return value.version
    if isinstance(value, GitPin):
        return value.ref
    return None


def _pin_row(stack: Stack, component: str, pin: UpstreamPin | None) -> tuple[str, str, Status, str] | None:
    ours = _ours(stack, component)
    if pin is None:  # installed, if at all, as whatever another package's requirement lets pip pick
        return None if ours is None else ("not pinned", ours, "unpinned upstream", "")
    theirs = pin.describe()
    if pin.kind == "unpinned":
        return theirs, ours or "not installed", "unpinned upstream", pin.where
    if ours is None:
        return theirs, "not installed", "differs", pin.where
    if component in ("mindspeed", "megatron_lm"):
        same = _same_ref(ours, pin.value)
    else:
        same = pin.kind in ("version", "spec", "branch") and _same_version(ours, pin)
    return theirs, ours, "same" if same else "differs", pin.where


def _base_rows(stack: Stack, image: UpstreamImage, chips: set[str]) -> list[tuple[str, str, str, bool]]:
    base = image.base
    if base is None:
        return [(c, "unknown base", "", False) for c in ("cann", "python", "os", "chip")]
    return [
        # a daily build of the stack's release is not that release: shown, and counted as a difference to explain
        ("cann", base.release, stack.cann, base.cann.lower() == stack.cann.lower() and not base.daily),
        ("python", base.python, stack.python, base.python == stack.python),
        ("os", base.os, ", ".join(stack.os), base.os in stack.os),
        ("chip", f"{base.cann_chip} ({base.chip or 'unknown'})", ", ".join(sorted(chips)), base.chip in chips),
    ]


def compare(loaded: LoadedMatrix, stack_id: str, file: str, image: UpstreamImage) -> ImageParity:
    stack = loaded.matrix.stacks[stack_id]
    reasons: dict[str, str] = {str(c): r for c, r in stack.upstream.differences.items()} if stack.upstream is not None else {}
    chips = {loaded.matrix.skus[sku].chip for sku in stack.skus}
    rows = []
    for component, theirs, ours, same in _base_rows(stack, image, chips):
        where = f"{file}: FROM"
        rows.append(Row(component, theirs, ours, "same" if same else "differs", where, None if same else reasons.get(component)))
    for component in COMPARED[4:]:
        found = _pin_row(stack, component, image.pins.get(component))
        if found is not None:
            theirs, ours, status, where = found
            rows.append(Row(component, theirs, ours, status, where, reasons.get(component) if status == "differs" else None))
    return ImageParity(stack_id, file, image, tuple(rows))


def parities(loaded: LoadedMatrix, vendored: Vendored | None = None) -> list[ImageParity]:
    """Every stack that names upstream images, beside each of them, in the matrix's order."""
    vendored = vendored or Vendored.load(loaded.root)
    out = []
    for stack_id, stack in loaded.matrix.stacks.items():
        for file in stack.upstream.images if stack.upstream is not None else ():
            out.append(compare(loaded, stack_id, file, vendored.image(file)))
    return out


def stale_reasons(loaded: LoadedMatrix, found: list[ImageParity]) -> dict[str, list[str]]:
    """Per stack, the reasons in ``upstream.differences`` with no difference under them in any of its images."""
    stale: dict[str, list[str]] = {}
    for stack_id, stack in loaded.matrix.stacks.items():
        if stack.upstream is None:
            continue
        differing = {row.component for p in found if p.stack_id == stack_id for row in p.differences}
        left = sorted(str(c) for c in set(stack.upstream.differences) - differing)
        if left:
            stale[stack_id] = left
    return stale


def problems(loaded: LoadedMatrix, found: list[ImageParity]) -> list[str]:
    """One line per difference without a reason, per stale reason and per unconfirmed pin the stack does not have:
    what the parity test refuses."""
    lines = [
        f"stack {p.stack_id}: {row.component} differs from {p.file} ({row.where or 'not installed there'}): "
        f"{p.file.split('/', 1)[0]} {row.theirs}, ours {row.ours}; "
        f"add its reason to stacks.{p.stack_id}.upstream.differences.{row.component}"
        for p in found
        for row in p.rows
        if row.unexplained
    ]
    for stack_id, stack in loaded.matrix.stacks.items():
        for component in stack.upstream.unconfirmed if stack.upstream is not None else ():
            if component not in COMPARED[:4] and _ours(stack, component) is None:
                lines.append(f"stack {stack_id}: upstream.unconfirmed.{component} names a component the stack does not pin: remove it")
    for stack_id, components in stale_reasons(loaded, found).items():
        lines += [
            f"stack {stack_id}: upstream.differences.{c} explains a difference its images no longer have: remove it" for c in components
        ]
    return lines
