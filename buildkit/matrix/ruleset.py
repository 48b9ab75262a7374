"""Every rule of the matrix, registered in order: :mod:`buildkit.matrix.rules`' own, then the
frontier lines' (:mod:`buildkit.matrix.pinrules`, which builds on the first). The one module that
imports both, so neither imports the other back."""

from __future__ import annotations

from buildkit.matrix import pinrules, rules
from buildkit.matrix.model import Matrix
from buildkit.matrix.rules import Violation

RULES = rules.RULES
assert pinrules.__name__  # imported for the rules it registers in RULES


def check(matrix: Matrix) -> list[tuple[str, Violation]]:
    """Run every rule; returns ``(rule_id, violation)`` pairs in rule order."""
    return [(rule_id, v) for rule_id, fn in RULES.items() for v in fn(matrix)]
