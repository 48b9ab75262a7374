"""The HCCL, HCCP and ACL error codes users hit most, found in a message and explained: the code, what
it means and the first thing to check (error_codes.json beside this file: data, each row with its source)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ERROR_CODES = Path(__file__).with_name("error_codes.json")  # beside this file, in the package and in the image


def error_codes() -> list[dict[str, str]]:
    """The table of HCCL, HCCP and ACL codes users hit most (error_codes.json: data, each with its source)."""
    try:
        return list(json.loads(ERROR_CODES.read_text(encoding="utf-8"))["codes"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def code_pattern(table: list[dict[str, str]]) -> re.Pattern[str]:
    """One pattern for every code of the table: a named code (EI0006) on its own, not inside a longer
    word or number; a numeric one (507033) only as an error's value ("error code is 507033",
    "errorCode = 507033", "failed: 507033"), never a process id or a metric that happens to match."""

    def alternatives(codes: list[str]) -> str:
        return "|".join(sorted((re.escape(c) for c in codes), key=len, reverse=True))

    named = [e["code"] for e in table if not e["code"].isdigit()]
    numeric = [e["code"] for e in table if e["code"].isdigit()]
    parts = []
    if named:
        parts.append(rf"(?<![0-9A-Za-z])(?P<named>{alternatives(named)})(?![0-9])")
    if numeric:
        context = r"(?:error[ _]?code|errcode|ret(?:code)?|result|error|failed)"
        parts.append(rf"(?i:{context})\s*(?:is\s+|=\s*|:\s*)?(?P<numeric>{alternatives(numeric)})(?![0-9])")
    return re.compile("|".join(parts) or "(?!)")


def codes_in(pattern: re.Pattern[str], text: str) -> list[str]:
    """The codes ``pattern`` finds in ``text``, in order, each once."""
    return list(dict.fromkeys(m["named"] or m["numeric"] for m in pattern.finditer(text)))


def explain(text: str, table: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    """The table's entries for every code ``text`` mentions, in the order they first appear."""
    table = error_codes() if table is None else table
    by_code = {e["code"]: e for e in table}
    return [by_code[code] for code in codes_in(code_pattern(table), text)]


def explained(text: str, context: str = "") -> str:
    """``text`` followed by what each code in it (or in ``context``, the whole message) means and the
    first thing to check."""
    notes = [f"{e['code']} ({e['name']}): {e['meaning']}; first check: {e['check']}" for e in explain(f"{text}\n{context}")]
    return text + "".join(f" [{note}]" for note in notes)
