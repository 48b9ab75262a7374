"""`ascendkit plan`: the build targets of the shipped matrix, computed here independently of plan_fleet."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.matrix.load import LoadedMatrix
from tests.conftest import MATRIX


def test_plan_all_lists_exactly_the_targets_the_matrix_defines(runner: CliRunner, loaded: LoadedMatrix) -> None:
    result = runner.invoke(app, ["plan", "--all", "--json", "--matrix", str(MATRIX)])
    assert result.exit_code == 0, result.stderr
    listed = json.loads(result.stdout)
    matrix = loaded.matrix
    expected = {
        (stack_id, matrix.skus[sku].chip, os_name, arch)
        for stack_id, stack in matrix.stacks.items()
        for sku in stack.skus
        for os_name in stack.os
        for arch in stack.arches
    }
    got = [(t["stack"], t["chip"], t["os"], t["arch"]) for t in listed]
    assert len(got) == len(set(got)) and set(got) == expected
    for t in listed:
        stack = matrix.stacks[t["stack"]]
        assert t["skus"] == [s for s in stack.skus if matrix.skus[s].chip == t["chip"]]
        assert t["base_image"].startswith("quay.io/ascend/cann:") and t["base_image"].endswith(f"-{t['os']}-py{stack.python}")
        assert t["tags"][0].endswith(f"-{t['chip']}-{t['os']}-py{stack.python}-{t['arch']}")
        assert t["lock_status"] in ("resolved", "unresolved")
        # what the committed lock itself records (whichever locks the machines that made them could resolve)
        lock = (MATRIX.parent / "locks" / f"{t['stack']}-{t['arch']}.txt").read_text(encoding="utf-8")
        recorded = re.search(r"^# status: (\w+)$", lock, re.M)
        assert recorded is not None and t["lock_status"] == recorded[1], (t["stack"], t["arch"])
    default = [t["lock_status"] for t in listed if t["stack"] == loaded.default_stack() and t["arch"] == "aarch64"]
    assert default and set(default) == {"resolved"}, "the default stack's images for the NPU hosts build from a resolved lock"


def test_filters_narrow_the_list(runner: CliRunner) -> None:
    result = runner.invoke(app, ["plan", "--hw", "900-podc", "--arch", "aarch64", "--json", "--matrix", str(MATRIX)])
    listed = json.loads(result.stdout)
    assert listed and all(t["chip"] == "a2" and t["arch"] == "aarch64" and "900-podc" in t["skus"] for t in listed)
    table = runner.invoke(app, ["plan", "--stack", "cann8.3", "--matrix", str(MATRIX)])
    assert table.exit_code == 0 and "cann8.3" in table.stdout and "cann8.5" not in table.stdout
