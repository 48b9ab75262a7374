"""Every rule of the matrix, in order: :mod:`buildkit.matrix.rules`' own, then the frontier lines'
(:mod:`buildkit.matrix.pinrules`, which builds on the first), then each framework plug-in's. The one
module that imports both, so neither imports the other back."""

from __future__ import annotations

from buildkit.framework import frameworks
from buildkit.matrix import pinrules, rules
from buildkit.matrix.model import Matrix
from buildkit.matrix.rules import Rule
from buildkit.violation import Violation

RULES = rules.RULES
assert pinrules.__name__  # imported for the rules it registers in RULES


def all_rules() -> dict[str, Rule]:
    """The matrix's rules and then the framework plug-ins', by rule id."""
    found = dict(RULES)
    for plugin in frameworks().values():
        found.update(plugin.rules())
    return found


def check(matrix: Matrix) -> list[tuple[str, Violation]]:
    """Run every rule; returns ``(rule_id, violation)`` pairs in rule order."""
    return [(rule_id, v) for rule_id, fn in all_rules().items() for v in fn(matrix)]
