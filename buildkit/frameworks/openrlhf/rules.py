"""The matrix rule of OpenRLHF stacks: its Ascend fork's release was validated with these pins
(``compat.openrlhf_ascend``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from packaging.specifiers import SpecifierSet

from buildkit.matrix.model import Matrix, OpenRlhfLine, PypiPin
from buildkit.matrix.rules import _no_fact, _stacks
from buildkit.violation import Violation

NAME = "openrlhf"
# The pins an OpenRLHF Ascend branch names, each a component of the stack (a test holds them to it).
CHECKED = tuple(name for name in OpenRlhfLine.model_fields if name != "cann")


def matches_stack(matrix: Matrix) -> Iterator[Violation]:
    """The OpenRLHF release's Ascend branch was validated with these pins (compat.openrlhf_ascend)."""
    table = matrix.compat.openrlhf_ascend
    for name, stack in _stacks(matrix):
        source = stack.frameworks.get(NAME)
        if source is None:
            continue
        release = source.version
        line = table.get(release)
        if line is None:
            yield _no_fact(
                ("stacks", name, NAME, "version"), f"Ascend validation for OpenRLHF {release}", "openrlhf_ascend", release, table
            )
            continue
        if stack.cann != line.cann:
            yield Violation(
                ("stacks", name, "cann"),
                f"OpenRLHF {release}'s Ascend branch was validated on CANN {line.cann}, not {stack.cann}",
                hint=f"cann: {line.cann}",
            )
        yield from _pins_in_line(name, release, line, stack.pins())


def _pins_in_line(name: str, release: str, line: OpenRlhfLine, pins: Mapping[str, PypiPin]) -> Iterator[Violation]:
    for component in CHECKED:
        spec = getattr(line, component)
        if spec is None:
            continue
        pin = pins.get(component)
        what = component.replace("_", "-")
        if pin is None:
            yield Violation(
                ("stacks", name),
                f"OpenRLHF {release} needs {what} ({spec}), which the stack does not pin",
                hint=f"{component}: {{version: ...}} in {spec}",
            )
        elif not SpecifierSet(spec).contains(version := pin.version, prereleases=True):
            yield Violation(
                ("stacks", name, component, "version"),
                f"OpenRLHF {release}'s Ascend branch was validated with {what} {spec}, not {version}",
                hint=f"{what} {spec.lstrip('=')}" if spec.startswith("==") else f"a version in {spec}",
            )
