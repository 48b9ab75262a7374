"""Support tables and the read commands that print them."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.matrix.tables import format_table, skus_table, stacks_table, support_tables
from tests.conftest import MATRIX

MATRIX_STACKS = tuple(load_matrix(MATRIX).matrix.stacks)
DEFAULT = load_matrix(MATRIX).default_stack()  # wherever `default: true` is: these tests follow it


def test_markdown_stack_table(loaded: LoadedMatrix) -> None:
    text = format_table(stacks_table(loaded.matrix), "md")
    lines = text.splitlines()
    assert lines[0].startswith("| stack | CANN | Python | torch / torch_npu |")
    assert len(lines) == 2 + len(loaded.matrix.stacks)
    assert sum(line.startswith(f"| {DEFAULT} (default) |") for line in lines) == 1
    row = next(line for line in lines if line.startswith("| cann8.3 "))
    assert "| 2.7.1 / 2.7.1 | 0.22.1 | 3.2.0 | vLLM 0.11.0, vllm-ascend 0.11.0 |" in row
    sglang = next(line for line in lines if line.startswith("| sglang-cann8.5 |"))
    assert "| SGLang 0.5.10, sgl-kernel-npu 2026.02.01 |" in sglang
    cann81 = next(line for line in lines if line.startswith("| cann8.1 |"))
    assert "| - |" in cann81  # no triton-ascend, no MindSpeed on 8.1


def test_rst_grid_table_is_well_formed(loaded: LoadedMatrix) -> None:
    text = format_table(skus_table(loaded.matrix), "rst")
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # every row as wide as the rules
    assert lines[0].startswith("+-") and lines[2].startswith("+=")
    assert any("| a2-box16 " in line and "| 16 " in line for line in lines)
    assert any(line.startswith("| a2 ") and "alias: a2-box16, 900-podc" in line for line in lines)


def test_table_command_formats(runner: CliRunner) -> None:
    md = runner.invoke(app, ["matrix", "table", "--matrix", str(MATRIX)])
    rst = runner.invoke(app, ["matrix", "table", "--format", "rst", "--matrix", str(MATRIX)])
    assert md.exit_code == rst.exit_code == 0
    assert md.stdout.startswith("| stack |") and rst.stdout.startswith("+--")


def test_readme_tables_match(loaded: LoadedMatrix) -> None:
    from tests.conftest import ROOT

    assert support_tables(loaded.matrix, "md") in (ROOT / "docs" / "matrix.md").read_text()


def test_list_json(runner: CliRunner) -> None:
    result = runner.invoke(app, ["matrix", "list", "--json", "--matrix", str(MATRIX)])
    rows = json.loads(result.stdout)
    assert [r["stack"] for r in rows] == list(MATRIX_STACKS)
    assert {r["stack"]: r["rollout"] for r in rows}["sglang-cann8.5"] == "SGLang 0.5.10"
    assert [r["stack"] for r in rows if r["default"]] == [DEFAULT]


def test_list_table_for_people(runner: CliRunner) -> None:
    result = runner.invoke(app, ["matrix", "list", "--matrix", str(MATRIX)])
    assert result.exit_code == 0
    assert f"{DEFAULT} (default)" in result.stdout
    assert "2.10.0.post4" in result.stdout  # piped output is not truncated


def test_show_json(runner: CliRunner) -> None:
    result = runner.invoke(app, ["matrix", "show", "cann9.1", "--json", "--matrix", str(MATRIX)])
    data = json.loads(result.stdout)
    assert data["torch_npu"]["version"] == "2.10.0.post4"
    assert data["triton_ascend"] == {
        "version": "3.2.2",
        "index": "ascend",
        "index_by_arch": {},
        "build_from_source": False,
        "extensions": [],
        "extras": [],
        "imports": [],
    }
    assert data["vllm_ascend"]["extensions"] == ["vllm_ascend.vllm_ascend_C"]
    assert data["drivers"]["hdk"] == ["25.2.X", "25.3.X", "25.5.X", "25.7.RC1", "26.0.RC1", "26.1.0"]
    assert "CANN 9.1.0 release notes" in data["drivers"]["source"]
    assert data["base_images"]["a3/openeuler24.03"] == "quay.io/ascend/cann:9.1.0-a3-openeuler24.03-py3.12"
    assert data["known_issues"] == []


def test_show_for_people_lists_known_issue(runner: CliRunner) -> None:
    result = runner.invoke(app, ["matrix", "show", "cann8.3", "--matrix", str(MATRIX)])
    assert result.exit_code == 0
    assert "known issue (warning)" in result.stdout
    assert "quay.io/ascend/cann:8.3.rc1-910b-ubuntu22.04-py3.11" in result.stdout
    assert "compiles vllm_ascend.vllm_ascend_C" in result.stdout and "host driver (Ascend HDK)" in result.stdout


def test_validate_ok(runner: CliRunner) -> None:
    result = runner.invoke(app, ["matrix", "validate", "--matrix", str(MATRIX)])
    assert result.exit_code == 0
    assert "valid" in result.stdout and f"{len(MATRIX_STACKS)} stacks (default {DEFAULT})" in result.stdout
    assert "warning:" in result.stderr
    data = json.loads(runner.invoke(app, ["matrix", "validate", "--json", "--matrix", str(MATRIX)]).stdout)
    assert data["valid"] is True and data["warnings"]  # a known issue, git refs that are not commits
