"""A stack proposed from an upstream Ascend Dockerfile (``ascendkit matrix import``).

The Dockerfile is read with :mod:`buildkit.matrix.upstream` (what an aarch64 build installs, in order), and each
pin it names exactly becomes the stack's pin, with the base image's CANN, chip, OS and Python. What a pin needs
beyond its version (its index, a source build, the extension modules to check, the PyTorch CPU index on x86_64)
is taken from the matrix's own stacks, which already say it for that component. Where the Dockerfile names no
release (a git commit, a branch head, an unpinned install) and the matrix needs one, the proposal takes the
value of the existing stack nearest to it and says so on that line; whatever has no place in the matrix is
listed at the top. The result is YAML for ``stacks:``: paste it, read the comments, run ``ascendkit matrix
validate``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from buildkit.errors import Finding, InputError, MatrixError
from buildkit.matrix.load import parse_matrix
from buildkit.matrix.model import GitPin, Matrix, PypiPin, Stack
from buildkit.matrix.upstream import UpstreamImage, UpstreamPin

REQUIRED = ("torch", "torch_npu", "torchvision", "transformers")
PYPI_ORDER = ("torch", "torch_npu", "torchvision", "triton_ascend", "vllm", "vllm_ascend", "sglang", "mbridge", "transformers")
GIT_ORDER = ("mindspeed", "megatron_lm")
FRAMEWORK = "verl"  # the framework verl's Dockerfiles install; a stack names it by this key
_ATB_CXX11_FROM = Version("8.5.0")  # NNAL's default ABI switched to cxx_abi_1 with CANN 8.5


@dataclass
class Proposal:
    stack_id: str
    source: str
    stanza: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # top-level key -> why its value is not the Dockerfile's
    unmapped: list[str] = field(default_factory=list)
    nearest: str | None = None

    def text(self) -> str:
        """The stanza as YAML under ``stacks:`` (two spaces in), with its notes as comments."""
        lines = [f"  # Proposed by `ascendkit matrix import` from {self.source}."]
        if self.nearest is not None:
            lines.append(f"  # Index, build and install settings, constraints and env follow stack {self.nearest} (nearest to it).")
        if self.unmapped:
            lines.append("  # Not mapped to the matrix (add by hand where the image needs it):")
            lines += [f"  #   {u}" for u in self.unmapped]
        lines.append(f"  {self.stack_id}:")
        for key, value in self.stanza.items():
            block = [f"{key}:"] if isinstance(value, dict) else [f"{key}: {_flow(value)}"]
            if isinstance(value, dict):
                block += [f"  {k}: {_flow(v)}" for k, v in value.items()]
            note = self.notes.get(key)
            if note is not None:
                block[0] += f"  # {note}"
            lines += [f"    {line}" for line in block]
        return "\n".join(lines) + "\n"


def _flow(value: object) -> str:
    """One value in YAML's flow style, quoted where YAML would read it as another type."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def stack_id_of(source: str) -> str:
    """A stack id from the Dockerfile's name: Dockerfile.ascend_9.0.0_a3_v0.8.0 -> ascend-9.0.0-a3-v0.8.0."""
    name = source.rsplit("/", 1)[-1].removeprefix("Dockerfile").strip("._-") or "imported"
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-.") or "imported"


def _exact(pin: UpstreamPin | None) -> str | None:
    """The release a pin names, if it names one: an exact version, or a release branch's release."""
    if pin is None or pin.kind not in ("version", "branch"):
        return None
    try:
        return Version(pin.value).public if pin.kind == "version" else pin.value
    except InvalidVersion:  # a wheel or a specifier naming no PEP 440 version: nothing to pin by
        return None


def _nearest(matrix: Matrix, image: UpstreamImage, chip: str | None) -> str | None:
    """The stack most like the image: the same CANN first, then the most equal pins, then serving its chip."""

    def score(item: tuple[str, Stack]) -> tuple[int, int, int]:
        stack = item[1]
        same = 0
        for component, pin in image.pins.items():
            mine = getattr(stack, component, None) if component in Stack.model_fields else stack.frameworks.get(component)
            value = mine.version if isinstance(mine, PypiPin) else mine.ref if isinstance(mine, GitPin) else None
            same += value is not None and value == (_exact(pin) or pin.value)
        chips = {matrix.skus[s].chip for s in stack.skus}
        base = image.base
        return (int(base is not None and stack.cann == base.cann), same, int(chip in chips))

    ranked = sorted(matrix.stacks.items(), key=score, reverse=True)
    return ranked[0][0] if ranked else None


def _template(matrix: Matrix, near: Stack | None, component: str, version: str | None) -> PypiPin | None:
    """A pin of ``component`` to copy settings from: one with the same version first, else the nearest stack's."""
    pins = [p for s in matrix.stacks.values() if isinstance(p := getattr(s, component, None), PypiPin)]
    same = [p for p in pins if p.version == version]
    if same:
        return same[0]
    mine = getattr(near, component, None) if near is not None else None
    return mine if isinstance(mine, PypiPin) else (pins[0] if pins else None)


def _pypi(template: PypiPin | None, version: str) -> dict[str, Any]:
    settings = template.model_dump(exclude_defaults=True, exclude={"version"}) if template is not None else {}
    return {"version": version, **settings}


def _base_fields(proposal: Proposal, matrix: Matrix, image: UpstreamImage, chip: str | None) -> None:
    base = image.base
    stanza = proposal.stanza
    stanza["description"] = f"imported from {proposal.source}"
    if base is None:
        proposal.unmapped.insert(0, "the base image is not an Ascend CANN image: cann, python, os and skus need values")
        return
    stanza["cann"] = base.cann
    stanza["python"] = base.python
    stanza["os"] = [base.os]
    stanza["arches"] = ["aarch64", "x86_64"]
    skus = [sku_id for sku_id, sku in matrix.skus.items() if sku.chip == chip]
    stanza["skus"] = skus
    if not skus:
        proposal.notes["skus"] = f"no SKU of the matrix has chip {base.cann_chip}: add one under skus"
    stanza["atb_cxx_abi"] = 1 if Version(re.sub(r"\.RC\d+$", ".0", base.cann)) >= _ATB_CXX11_FROM else 0


def propose(matrix: Matrix, image: UpstreamImage, source: str, stack_id: str | None = None) -> Proposal:
    proposal = Proposal(stack_id or stack_id_of(source), source, unmapped=list(image.unmapped))
    chip = image.base.chip if image.base is not None else None
    proposal.nearest = _nearest(matrix, image, chip)
    near = matrix.stacks[proposal.nearest] if proposal.nearest is not None else None
    _base_fields(proposal, matrix, image, chip)
    for component in PYPI_ORDER:
        pin = image.pins.get(component)
        version = _exact(pin)
        if version is None:
            mine = getattr(near, component, None) if near is not None else None
            if component not in REQUIRED and (pin is None or not isinstance(mine, PypiPin)):
                if pin is not None:
                    proposal.unmapped.append(f"{component}: {pin.describe()} ({pin.where}): no release to pin")
                continue
            if not isinstance(mine, PypiPin):
                proposal.unmapped.append(f"{component}: required, and neither the Dockerfile nor a stack names a release")
                continue
            version = mine.version
            _filled(proposal, component, pin, version, "not pinned")
        proposal.stanza[component] = _pypi(_template(matrix, near, component, version), version)
    for component in GIT_ORDER:
        pin = image.pins.get(component)
        if pin is None or pin.kind == "unpinned":
            continue
        template = getattr(near, component, None)
        repo = {"mindspeed": "mindspeed", "megatron_lm": "megatron-lm"}[component]
        settings = template.model_dump(exclude_defaults=True, exclude={"ref"}) if isinstance(template, GitPin) else {"repo": repo}
        proposal.stanza[component] = {"repo": settings.pop("repo", repo), "ref": pin.value, **settings}
    _archive(proposal, matrix, image)
    _framework(proposal, image, near)
    handled = {*PYPI_ORDER, *GIT_ORDER, FRAMEWORK, "sgl_kernel_npu"}
    proposal.unmapped += [f"{c}: {p.describe()} ({p.where}): no place in the matrix" for c, p in image.pins.items() if c not in handled]
    if near is not None:
        for key in ("constraints", "overrides", "env"):
            value = getattr(near, key)
            if value and key != "overrides":
                proposal.stanza[key] = dict(value)
                proposal.notes[key] = f"as stack {proposal.nearest} has them: check they hold"
    return proposal


def _filled(proposal: Proposal, key: str, pin: UpstreamPin | None, version: str, absent: str) -> None:
    """Say on the line that ``key`` took ``version`` from the nearest stack, and what the Dockerfile had instead."""
    said = f"{pin.describe()} at {pin.where}" if pin is not None else absent
    proposal.notes[key] = f"the Dockerfile: {said}; {version} from stack {proposal.nearest}"


def _framework(proposal: Proposal, image: UpstreamImage, near: Stack | None) -> None:
    pin = image.pins.get(FRAMEWORK)
    version = _exact(pin)
    if version is None:
        fallback = near.frameworks.get(FRAMEWORK) if near is not None else None
        if not isinstance(fallback, PypiPin):
            proposal.unmapped.append(f"{FRAMEWORK}: no release named, and no stack to take one from")
            return
        version = fallback.version
        _filled(proposal, FRAMEWORK, pin, version, "not installed")
    proposal.stanza[FRAMEWORK] = {"version": version}


def with_proposal(matrix_text: str, proposal: Proposal) -> str:
    """The matrix text with the proposed stanza first under ``stacks:``."""
    m = re.search(r"^stacks:[ \t]*(#.*)?\n", matrix_text, flags=re.MULTILINE)
    if m is None:
        raise InputError("the matrix has no top-level `stacks:` line to add the proposal under")
    return matrix_text[: m.end()] + proposal.text() + matrix_text[m.end() :]


def findings(matrix_text: str, matrix_path: Path, proposal: Proposal) -> list[Finding]:
    """What ``matrix validate`` says of the matrix with the proposal added: its errors (none: it validates)."""
    # the stacks by name, not any two-space key of the file (a chip or SKU may be called what the proposal is)
    if proposal.stack_id in parse_matrix(matrix_text, matrix_path).matrix.stacks:
        raise InputError(f"{matrix_path}: a stack named {proposal.stack_id} exists; give the proposal another id (--id)")
    try:
        parse_matrix(with_proposal(matrix_text, proposal), matrix_path)
    except MatrixError as exc:
        return [f for f in exc.findings if f.severity == "error"]
    return []


def _archive(proposal: Proposal, matrix: Matrix, image: UpstreamImage) -> None:
    """sgl-kernel-npu's release archive, where a stack already describes that release (its file name per chip and
    arch, its wheels and their hashes); a source build of it has no place in the matrix."""
    pin = image.pins.get("sgl_kernel_npu")
    if pin is None:
        return
    downloaded = image.archives.get("sgl_kernel_npu", "")

    def same_file(template: str) -> bool:  # the stack's file name, {chip} and {arch} left open, is the one downloaded
        pattern = re.escape(template).replace(re.escape("{chip}"), "[^-]+").replace(re.escape("{arch}"), ".+")
        return re.fullmatch(pattern, downloaded) is not None

    stacks = matrix.stacks.values()
    known = [a for s in stacks if (a := s.sgl_kernel_npu) is not None and a.release == pin.value and same_file(a.file)]
    if not known:
        proposal.unmapped.append(f"sgl_kernel_npu: {pin.describe()} ({pin.where}): no stack describes this release's archives")
        return
    proposal.stanza["sgl_kernel_npu"] = known[0].model_dump(exclude_defaults=True)
