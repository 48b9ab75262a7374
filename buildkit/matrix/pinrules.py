"""The rules of the frontier lines' pins: one rollout engine (vLLM or SGLang, whole), and Ascend's
tools only where their own requirements hold. Registered in :data:`rules.RULES` with the rest."""

from __future__ import annotations

from collections.abc import Iterator

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from buildkit.framework import frameworks
from buildkit.matrix.model import TOOL_COMPONENTS, Matrix
from buildkit.matrix.rules import _no_fact, _stacks, canonical, rule
from buildkit.violation import Violation

ENGINE_PINS = {"vllm": ("vllm", "vllm_ascend"), "sglang": ("sglang", "sgl_kernel_npu")}
ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang"}


@rule("one-rollout")
def one_rollout(matrix: Matrix) -> Iterator[Violation]:
    """One rollout engine with its Ascend half: vLLM and vllm-ascend, or SGLang (built from its
    NPU project file) and sgl-kernel-npu's kernels for every chip of the stack; one the stack's framework rolls out with."""
    for name, stack in _stacks(matrix):
        vllm = (stack.vllm, stack.vllm_ascend)
        sglang = (stack.sglang, stack.sgl_kernel_npu)
        if any(vllm) == any(sglang) or None in (vllm if any(vllm) else sglang):
            yield Violation(
                ("stacks", name),
                "a stack pins one rollout engine, whole: vllm and vllm_ascend, or sglang and sgl_kernel_npu",
                hint="vllm + vllm_ascend, or sglang + sgl_kernel_npu",
            )
        elif (plugin := frameworks().get(next(iter(stack.frameworks), ""))) is not None and stack.rollout not in plugin.rollouts:
            yield Violation(
                ("stacks", name, stack.rollout),
                f"{plugin.title}'s images roll out with {' or '.join(ENGINE_TITLES[e] for e in plugin.rollouts)} only",
                hint=" + ".join(ENGINE_PINS[plugin.rollouts[0]]),
            )
        if stack.sglang is not None and stack.sglang.project_file is not None and not stack.sglang.build_from_source:
            yield Violation(
                ("stacks", name, "sglang", "project_file"), "a project file is used by a source build", hint="build_from_source: true"
            )
        archive = stack.sgl_kernel_npu
        for chip in [c for c in matrix.stack_chips(stack) if c not in archive.chips] if archive else ():
            yield Violation(
                ("stacks", name, "sgl_kernel_npu", "chips"),
                f"the stack serves chip {chip}, for which sgl-kernel-npu names no archive",
                hint=f"an entry for {chip}, or drop its SKUs from the stack",
            )


@rule("tool-fits-stack")
def tool_fits_stack(matrix: Matrix) -> Iterator[Violation]:
    """An Ascend tool goes only where its own requirements hold: the stack's Python, its pins and
    constraints (ais-bench-benchmark's numpy<2 rules out a stack on NumPy 2). Such a stack leaves
    the tool out and says why next to its pins."""
    table = matrix.compat.tool_requirements
    for name, stack in _stacks(matrix):
        stack_pins = stack.pins()
        pins = {canonical(pin.dist(c)): pin.version for c, pin in stack_pins.items()}
        for component in TOOL_COMPONENTS:
            pin = stack_pins.get(component)
            if pin is None:
                continue
            dist = pin.dist(component)
            path = ("stacks", name, component, "version")
            needs = table.get(dist, {}).get(pin.version)
            if needs is None:
                yield _no_fact(
                    path, f"requirements of {dist} {pin.version}", "tool_requirements", f"{dist}.{pin.version}", table.get(dist, {})
                )
                continue
            clashes: dict[str, None] = {}  # each once, in the order found: the same on every arch is said once
            for arch in stack.arches:  # an arch's constraints replace the stack's for that package (as the lock reads them)
                constraints = {canonical(k): v for k, v in {**stack.constraints, **stack.constraints_by_arch.get(arch, {})}.items()}
                for package, spec in needs.items():
                    clash = _clash(canonical(package), spec, stack.python, pins, constraints)
                    if clash:
                        clashes[f"{dist} {pin.version} requires {package}{spec}, which the stack's {clash} rules out"] = None
            for message in clashes:
                yield Violation(path, message, hint=f"leave {component} out of this stack, with the reason")


def _clash(key: str, spec: str, python: str, pins: dict[str, str], constraints: dict[str, str]) -> str | None:
    """What of the stack rules out the tool's requirement ``key`` ``spec``, if anything."""
    if key == "python":
        return None if SpecifierSet(spec).contains(python) else f"Python {python}"
    if key in pins:
        return None if SpecifierSet(spec).contains(pins[key], prereleases=True) else f"{key} {pins[key]}"
    if key in constraints:
        return None if _overlap(spec, constraints[key]) else f"the constraint {key}{constraints[key]}"
    return None


def _overlap(first: str, second: str) -> bool:
    """Whether two specifiers admit a common version: tried on each version they name, just below and just above it."""
    a, b = SpecifierSet(first), SpecifierSet(second)
    candidates = {"0", "99999"}
    for spec in (*a, *b):
        release = list(Version(spec.version.rstrip(".*")).release)
        candidates |= {spec.version.rstrip(".*"), ".".join(map(str, [*release, 1]))}
        nonzero = [i for i, part in enumerate(release) if part]
        if nonzero:
            below = [*release[: nonzero[-1]], release[nonzero[-1]] - 1, 9999]
            candidates.add(".".join(map(str, below)))
    return any(a.contains(c, prereleases=True) and b.contains(c, prereleases=True) for c in candidates)
