"""The README fits on a screen and points into docs/; every link between the pages lands; the rooms fit."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text, fenced, found = page.read_text(encoding="utf-8"), False, set()
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"^#{1,6} (.+)$", line)):
            found.add(slug(m[1]))
    return found


def test_the_readme_fits_on_a_screen_and_keeps_the_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    assert "make test" in readme and "make test" in (ROOT / ".ci" / "run").read_text()
    assert {"## Install", "## Common tasks", "## Exit codes", "## Documentation"} <= set(readme.splitlines())


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_lands(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        assert where.exists(), f"{page.name}: {target} points at nothing"
        if anchor and where.suffix == ".md":
            assert anchor in anchors(where), f"{page.name}: {target}: no such heading in {where.name}"


def test_every_docs_page_is_listed_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, page.name


def test_no_module_is_over_400_lines() -> None:
    """Rooms that fit: a module that grows past this is split by what it does (docs/architecture.md)."""
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in (ROOT / "buildkit").rglob("*.py")}
    assert not {name: n for name, n in sizes.items() if n > 400}


def test_no_command_function_is_over_60_lines() -> None:
    """A command reads as its options (one line each: declared once as types in cli/*_options.py), one
    call into its stage's request builder, and its printing; what grows past that goes to a helper."""
    long = {}
    for path in (ROOT / "buildkit" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > 60:
                long[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert not long
