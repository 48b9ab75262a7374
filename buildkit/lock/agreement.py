"""Do a stack's pins agree with what each of them declares it requires? Checked per arch, for the
stack's Python, from each pin's published metadata (:mod:`buildkit.lock.metadata`), whether or not
the lock can be resolved on this machine: a requirement of one pin that another pin's version does
not satisfy is a disagreement, unless the stack's ``overrides`` names the required package (the
layered install lets the later pin win, and the matrix says why). An override that no disagreement
needs is reported too: it hides nothing any more and should go.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from buildkit.lock.metadata import Declared
from buildkit.matrix.model import PypiPin, Stack

# What a requirement's markers see on the target: Linux, CPython, the stack's Python and the arch.
_PLATFORM = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython"}


@dataclass(frozen=True)
class Disagreement:
    """``requirer`` requires ``requirement`` of ``required``, which the stack pins at a version outside it."""

    stack: str
    arch: str
    requirer: str
    requirer_version: str
    required: str
    pinned: str
    requirement: str
    overridden: bool

    def message(self) -> str:
        said = f"{self.requirer} {self.requirer_version} requires {self.requirement}, and the stack pins {self.required} {self.pinned}"
        return said + (" (overridden by the stack: the later pin wins)" if self.overridden else "")


def environment(python: str, arch: str) -> dict[str, str]:
    """The marker environment of the target: the stack's Python on Linux on ``arch``."""
    return {
        **_PLATFORM,
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_version": f"{python}.0",
        "platform_machine": arch,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_version": "",
    }  # written out, never this host's: the answer depends only on the stack


def pinned(stack: Stack) -> dict[str, tuple[str, PypiPin]]:
    """Canonical distribution name -> (component, pin) for every index pin of the stack."""
    return {canonicalize_name(pin.dist(component)): (component, pin) for component, pin in stack.pins().items()}


def disagreements(stack_id: str, stack: Stack, arch: str, declared: Mapping[str, Declared]) -> list[Disagreement]:
    """Every requirement among the pins of ``declared`` (canonical name -> what it declares) that
    another pin does not meet on ``arch``; extras are not asked for, so their requirements do not count."""
    env = {**environment(stack.python, arch), "extra": ""}
    pins = pinned(stack)
    overrides = {canonicalize_name(name) for name in stack.overrides}
    found: list[Disagreement] = []
    for name, release in sorted(declared.items()):
        for line in release.requires:
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue  # a line packaging cannot parse is not judged here (the resolver will say what it makes of it)
            required = canonicalize_name(requirement.name)
            if required == name or required not in pins or (requirement.marker is not None and not requirement.marker.evaluate(env)):
                continue
            component, pin = pins[required]
            if not _meets(requirement, pin.version):
                found.append(
                    Disagreement(
                        stack_id,
                        arch,
                        release.dist,
                        release.version,
                        pin.dist(component),
                        pin.version,
                        str(requirement),
                        required in overrides,
                    )
                )
    return found


def _meets(requirement: Requirement, version: str) -> bool:
    """Does the pinned ``version`` satisfy the requirement? A pin with no local label (``2.5.1``)
    installs whatever its index serves for it (the PyTorch CPU index: ``2.5.1+cpu``), so a
    requirement of a local build (``torch==2.5.1+cpu``) is met by the same public version."""
    if requirement.specifier.contains(version, prereleases=True):
        return True
    if "+" in version:
        return False
    locals_named = {spec.version.split("+", 1)[1] for spec in requirement.specifier if "+" in spec.version}
    return any(requirement.specifier.contains(f"{version}+{label}", prereleases=True) for label in locals_named)


def unused_overrides(stack: Stack, found: list[Disagreement], complete: bool) -> list[str]:
    """The stack's overrides of pinned packages that no disagreement needs (said only when every pin's
    metadata was read: an unread one may be what needs it). Overrides of unpinned packages (a
    dependency's dependency) are not judged here."""
    if not complete:
        return []
    needed = {canonicalize_name(d.required) for d in found}
    pins = pinned(stack)
    return sorted(name for name in stack.overrides if canonicalize_name(name) in pins and canonicalize_name(name) not in needed)


def check_stack(
    stack_id: str, stack: Stack, arch: str, read: Callable[[str, PypiPin], Declared | None]
) -> tuple[list[Disagreement], list[str], list[str]]:
    """(disagreements, overrides no longer needed, pins whose metadata could not be read) of one
    stack on one arch; ``read(component, pin)`` gives a pin's declared requirements, or None."""
    declared: dict[str, Declared] = {}
    unread: list[str] = []
    for component, pin in stack.pins().items():
        release = read(component, pin)
        if release is None:
            unread.append(f"{pin.dist(component)}=={pin.version}")
        else:
            declared[canonicalize_name(pin.dist(component))] = release
    found = disagreements(stack_id, stack, arch, declared)
    return found, unused_overrides(stack, found, complete=not unread), unread
