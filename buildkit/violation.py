"""What a rule of the matrix reports: where (a path of keys and indexes into the YAML), what is wrong,
what would be valid, how bad. Below both the matrix's rules (:mod:`buildkit.matrix.rules`) and the
framework plug-ins that bring rules of their own (:mod:`buildkit.framework`), so neither has to name
the other for it."""

from __future__ import annotations

from dataclasses import dataclass

PathKey = tuple[str | int, ...]  # ("stacks", "cann8.3", "torch", "version"); an int indexes a list


@dataclass(frozen=True)
class Violation:
    path: PathKey
    message: str
    hint: str = ""
    severity: str = "error"
