"""The page of each image repository (docs/repositories/), generated from the matrix."""

from __future__ import annotations

from pathlib import Path

from buildkit import generate
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.pages.overview import overview_page, overview_pages
from buildkit.plan import alias_tags, all_targets, full_tag
from tests.conftest import ROOT, edit


def test_a_page_per_framework_with_every_tag_of_it_and_none_of_another(loaded: LoadedMatrix) -> None:
    pages = dict(overview_pages(loaded))
    assert set(pages) == {"docs/repositories/verl.md", "docs/repositories/openrlhf.md"}
    for target in all_targets(loaded):
        stack = loaded.matrix.stacks[target.stack_id]
        tag = full_tag(stack, target.chip_id, target.os_name)
        own, other = ("verl", "openrlhf") if stack.framework == "verl" else ("openrlhf", "verl")
        assert f"| `{tag}` |" in pages[f"docs/repositories/{own}.md"] and tag not in pages[f"docs/repositories/{other}.md"]
        for alias in alias_tags(target.stack_id, stack, target.chip_id, target.os_name):
            assert f"`{alias}`" in pages[f"docs/repositories/{own}.md"]
    verl = pages["docs/repositories/verl.md"]
    assert verl.startswith("# `ascendkit/verl`\n") and "Atlas 800T A3 (`a3`)" in verl and "--job sft" in verl
    assert "| 8.3.RC1 | 25.3.RC1 (the paired release; older ones unconfirmed) |" in verl
    assert "--job sft" not in pages["docs/repositories/openrlhf.md"], "OpenRLHF images have the GRPO job only"


def test_the_committed_pages_are_the_matrixs_and_move_with_it(loaded: LoadedMatrix, tmp_path: Path) -> None:
    for path, text in overview_pages(loaded):
        assert (ROOT / path).read_text(encoding="utf-8") == text, f"{path}: run `ascendkit render --all`"
    text = (ROOT / "compat_matrix.yaml").read_text(encoding="utf-8")
    verl = loaded.matrix.stacks["cann8.3"].framework_version  # its pin line, with the comment that makes it unique
    (tmp_path / "compat_matrix.yaml").write_text(edit(text, f"      version: {verl}  #", "      version: 0.6.9  #"), encoding="utf-8")
    before, after = overview_page(loaded, "verl"), overview_page(load_matrix(tmp_path / "compat_matrix.yaml"), "verl")
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert changed and all(f"verl{verl}-" in a and "verl0.6.9-" in b for a, b in changed[:-1])
    assert changed[-1][1].startswith("Frameworks: ") and "verl 0.6.9" in changed[-1][1]


def test_a_page_no_framework_makes_is_stale(repo_copy: Path) -> None:
    (repo_copy / "docs" / "repositories" / "sglang.md").write_text("# gone\n")
    diffs = generate.check(load_matrix(repo_copy / "compat_matrix.yaml"))
    assert len(diffs) == 1 and "--- a/docs/repositories/sglang.md\n+++ /dev/null" in diffs[0]
