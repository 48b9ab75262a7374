"""`ascendkit matrix outdated` against the real PyPI: the test stack's pins are small real packages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from buildkit.cli import app
from buildkit.errors import ExitCode
from buildkit.matrix.load import load_matrix
from tests.conftest import TEST_MATRIX


def planted(tmp_path: Path) -> Path:
    """The test matrix with verl (played by idna) planted at an older release."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(TEST_MATRIX.read_text().replace('version: "3.7"', 'version: "3.4"'))
    return matrix


@pytest.mark.network
def test_a_planted_older_pin_is_found_and_the_newer_one_proposed(runner: CliRunner, tmp_path: Path) -> None:
    matrix = planted(tmp_path)
    result = runner.invoke(app, ["matrix", "outdated", "--stack", "teststack", "--json", "--matrix", str(matrix)])
    assert result.exit_code == 0, result.stderr
    (news,) = json.loads(result.stdout)
    pins = {p["component"]: p for p in news["pins"]}
    verl = pins["verl"]
    assert verl["status"] == "outdated" and verl["package"] == "idna"
    assert Version(verl["accepted"]) >= Version("3.7") and verl["accepted"] == verl["newer"][0]
    assert verl["sources"] == ["https://pypi.org/simple", "https://pypi.org/simple"]
    # vllm-ascend is vllm's plugin line: refused alone, accepted together on one minor line
    vllm, plugin = pins["vllm"], pins["vllm_ascend"]
    if vllm["accepted"] or plugin["accepted"]:
        assert Version(vllm["accepted"] or vllm["pinned"]).release[:2] == Version(plugin["accepted"] or plugin["pinned"]).release[:2]

    stanza = runner.invoke(app, ["matrix", "outdated", "--stack", "teststack", "--propose", "teststack2", "--matrix", str(matrix)])
    assert stanza.exit_code == 0, stanza.stderr
    assert stanza.stdout.splitlines()[3] == "  teststack2:"
    assert f'version: "{verl["accepted"]}"  # was 3.4 in teststack' in stanza.stdout
    assert "default: false" in stanza.stdout
    extended = tmp_path / "extended.yaml"
    extended.write_text(matrix.read_text() + stanza.stdout)  # stacks: is the file's last section
    validated = runner.invoke(app, ["matrix", "validate", "--matrix", str(extended)])
    assert validated.exit_code == 0, validated.stderr
    proposed = load_matrix(extended).matrix.stacks["teststack2"]
    assert proposed.framework_version == verl["accepted"] and not proposed.default


@pytest.mark.network
def test_a_release_outside_the_stacks_override_is_not_accepted(runner: CliRunner, tmp_path: Path) -> None:
    """cann9.1 and cann9.2 override transformers to 5.10.4 because verl 0.9.1 wants <5.11: a newer transformers the
    rules accept alone is still held by the override (here six, the test stack's transformers, held at 1.16.0)."""
    matrix = tmp_path / "matrix.yaml"
    text = TEST_MATRIX.read_text()
    anchor = '    constraints:\n      numpy: "<2.0.0"\n    env:\n      ASCENDKIT_TEST_STACK: "1"\n'
    assert anchor in text
    matrix.write_text(text.replace(anchor, anchor + '    overrides:\n      six: "==1.16.0"\n', 1))
    result = runner.invoke(app, ["matrix", "outdated", "--stack", "teststack", "--json", "--matrix", str(matrix)])
    assert result.exit_code == 0, result.stderr
    (news,) = json.loads(result.stdout)
    transformers = {p["component"]: p for p in news["pins"]}["transformers"]
    assert transformers["status"] == "outdated" and "1.17.0" in transformers["newer"], transformers
    assert transformers["accepted"] is None, "held by the override"
    said = "the stack's overrides hold six at ==1.16.0 (see why): move the override with it"
    assert transformers["refused"][0][1] == said, transformers["refused"]


@pytest.mark.network
def test_an_unreachable_index_is_reported_not_guessed(runner: CliRunner, tmp_path: Path) -> None:
    matrix = planted(tmp_path)
    argv = [
        "matrix",
        "outdated",
        "--stack",
        "teststack",
        "--pytorch-index-url",  # the test matrix's pypi-again index, redirected as any mirror is
        "http://127.0.0.1:9/simple",
        "--json",
        "--matrix",
        str(matrix),
    ]
    result = runner.invoke(app, argv)
    assert result.exit_code == ExitCode.UNVERIFIED
    pins = {p["component"]: p for p in json.loads(result.stdout)[0]["pins"]}
    assert pins["torch"]["status"] == "unreachable" and pins["torch"]["accepted"] is None and pins["torch"]["newer"] == []
    assert pins["verl"]["status"] == "outdated", "pins on a reachable index are still answered"
    table = runner.invoke(app, [a for a in argv if a != "--json"])  # piped: the table as plain columns
    torch = next(line for line in table.stdout.splitlines() if " torch " in line)
    assert "use a mirror: --pip-index-url, or [mirrors] in ascendkit.toml" in torch, "the hint whole, its [mirrors] kept"


def test_propose_refusals(runner: CliRunner, tmp_path: Path) -> None:
    matrix = planted(tmp_path)
    no_stack = runner.invoke(app, ["matrix", "outdated", "--propose", "x", "--matrix", str(matrix)])
    assert no_stack.exit_code == ExitCode.INVALID_INPUT and "give --stack" in no_stack.stderr
    taken = runner.invoke(app, ["matrix", "outdated", "--stack", "teststack", "--propose", "teststack", "--matrix", str(matrix)])
    assert taken.exit_code == ExitCode.INVALID_INPUT and "already has that stack" in taken.stderr
