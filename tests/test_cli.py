"""The CLI against bad input: a clear message, a documented non-zero exit, no traceback, no partial file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from buildkit import __version__
from buildkit.cli import app
from buildkit.errors import ExitCode
from tests.conftest import MATRIX, MATRIX_TEXT, ROOT, EditMatrix, line_of

# (id, edits to the shipped matrix, text the message must contain, line the error must point at)
# A line of None means "no specific line" (e.g. an empty file); otherwise the location is checked.
BAD_MATRICES: list[tuple[str, list[tuple[str, str]], str, str | None]] = [
    ("malformed-yaml", [("stacks:\n  cann8.1:", "stacks:\n  cann8.1: [")], "malformed YAML", None),
    ("bad-indentation", [("    cann: 8.2.RC1\n", "   cann: 8.2.RC1\n")], "malformed YAML", None),
    (
        "unknown-stack-key",
        [("    atb_cxx_abi: 0\n    torch:\n      version: 2.7.1", "    atb_cxx_ab: 0\n    torch:\n      version: 2.7.1")],
        "unknown key 'atb_cxx_ab' (did you mean 'atb_cxx_abi'?)",
        "atb_cxx_ab:",
    ),
    ("unknown-top-level-key", [("schema_version: 1\n", "schema_version: 1\nstakcs: {}\n")], "unknown key 'stakcs'", "stakcs:"),
    ("unknown-pin-key", [("    verl:\n      version: ", "    verl:\n      verison: ")], "unknown key 'verison'", "verison:"),
    # a key no framework plug-in owns, its value a well-formed pin: unknown all the same, where it stands
    (
        "unknown-framework-key",
        [("    verl:\n      version: ", "    verll:\n      version: ")],
        "unknown key 'verll' (did you mean 'verl'?)",
        "verll:",
    ),
    ("wrong-type-int", [("    npus_per_node: 8\n", "    npus_per_node: eight\n")], "expected an integer", "npus_per_node: eight"),
    ("python-unquoted", [('    python: "3.10"\n', "    python: 3.10\n")], 'quote the value as written: "3.10"', "python: 3.10"),
    (
        "torch-npu-vs-torch",
        [("    torch_npu:\n      version: 2.7.1\n", "    torch_npu:\n      version: 2.8.0\n")],
        "torch_npu 2.8.0 is built for torch 2.8.0",
        "version: 2.8.0\n",
    ),
    ("torchvision-vs-torch", [("      version: 0.22.1\n", "      version: 0.21.0\n")], "valid: torchvision 0.22.1", "version: 0.21.0"),
    (
        "vllm-ascend-minor",
        [("    vllm:\n      version: 0.11.0\n", "    vllm:\n      version: 0.10.0\n")],
        "vllm-ascend 0.11.0 is the plugin for vllm 0.11.*, but the stack pins vllm 0.10.0",
        "version: 0.11.0\n",
    ),
    (
        "python-out-of-range",
        [('    python: "3.11"  # the quickstart', '    python: "3.13"  # the quickstart')],
        "Python 3.13 is outside what torch 2.7",
        'python: "3.13"',
    ),
    ("unknown-sku", [("    skus: [a2-box16, 900-podc]  #", "    skus: [a2-box16, 800t-a2]  #")], "unknown SKU '800t-a2'", "800t-a2"),
    (
        "two-defaults",
        # the last stack of the file, after wherever the default is: the rule reports the later one
        [("    description: OpenRLHF 0.7.5 on Ascend", "    default: true\n    description: OpenRLHF 0.7.5 on Ascend")],
        "more than one default stack",
        "default: true\n    description: OpenRLHF 0.7.5",
    ),
    ("no-default", [("    default: true\n", "")], "no stack is marked `default: true`", None),
    ("duplicate-key", [("    cann: 9.1.0\n", "    cann: 9.1.0\n    cann: 9.0.1\n")], "duplicate key 'cann'", "cann: 9.0.1"),
    ("missing-field", [("    cann: 8.5.0\n", "")], "stacks.cann8.5.cann: required field is missing", None),
    ("invalid-version", [("      version: 2.10.0\n", "      version: 2.10.x\n")], "is not a PEP 440 version", "version: 2.10.x"),
    (
        "invalid-specifier",
        [
            (
                '      numpy: "<2.0.0"\n',
                '      numpy: "<<2"\n',
            )
        ],
        "is not a PEP 440 specifier",
        'numpy: "<<2"',
    ),
    ("unknown-index", [("      index: ascend  #", "      index: ascnd  #")], "unknown index 'ascnd'", "index: ascnd"),
    (
        "torch-npu-vs-cann",
        [('    "2.7.1": ["8.3.RC1"]', '    "2.7.1": ["8.2.RC1"]')],
        "torch_npu 2.7.1 belongs to CANN 8.2.RC1, not 8.3.RC1",
        None,
    ),
    ("bad-arch", [("    arches: [aarch64, x86_64]\n", "    arches: [arm64, x86_64]\n")], "'arm64' is not allowed", "arches: [arm64"),
    ("bad-sku-chip", [("    chip: a3\n", "    chip: a4\n")], "unknown chip 'a4'", "chip: a4"),
    ("bad-cann-pattern", [("    cann: 8.2.RC1\n", "    cann: 8.2-rc1\n")], "'8.2-rc1' is not valid here", "cann: 8.2-rc1"),
]


def _first_line_containing(text: str, needle: str) -> int:
    return line_of(text, needle.rstrip("\n")) if "\n" not in needle.rstrip("\n") else _multi(text, needle)


def _multi(text: str, needle: str) -> int:
    index = text.index(needle)
    return text.count("\n", 0, index) + 1


@pytest.mark.parametrize(("case", "edits", "expected", "at"), BAD_MATRICES, ids=[c[0] for c in BAD_MATRICES])
def test_bad_matrix_validate(
    runner: CliRunner, matrix_copy: EditMatrix, case: str, edits: list[tuple[str, str]], expected: str, at: str | None
) -> None:
    path = matrix_copy(*edits)
    result = runner.invoke(app, ["matrix", "validate", "--matrix", str(path)])
    assert result.exit_code == ExitCode.INVALID_INPUT, result.output
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if at is not None:
        line = _first_line_containing(path.read_text(), at)
        assert f"{path}:{line}:" in result.stderr, result.stderr


@pytest.mark.parametrize(("case", "edits", "expected", "at"), BAD_MATRICES, ids=[c[0] for c in BAD_MATRICES])
def test_bad_matrix_render_writes_nothing(
    runner: CliRunner, matrix_copy: EditMatrix, tmp_path: Path, case: str, edits: list[tuple[str, str]], expected: str, at: str | None
) -> None:
    path = matrix_copy(*edits)
    out = tmp_path / "Dockerfile.out"
    result = runner.invoke(app, ["render", "--hw", "a3", "--matrix", str(path), "-o", str(out)])
    assert result.exit_code == ExitCode.INVALID_INPUT
    assert expected in result.stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".Dockerfile")] == []


def test_errors_are_collected_not_one_at_a_time(runner: CliRunner, matrix_copy: EditMatrix) -> None:
    path = matrix_copy(
        ("      version: 0.22.1\n", "      version: 0.21.0\n"),
        ("    skus: [a2-box16, 900-podc]  #", "    skus: [a2-box16, 800t-a2]  #"),
        ("    npus_per_node: 8\n", "    npus_per_node: eight\n"),
    )
    # Structure errors stop before the rules (rules need a well-typed matrix) ...
    result = runner.invoke(app, ["matrix", "validate", "--matrix", str(path)])
    assert "npus_per_node" in result.stderr
    # ... and with the structure fixed, every rule violation is reported together.
    path.write_text(path.read_text().replace("npus_per_node: eight", "npus_per_node: 8"))
    result = runner.invoke(app, ["matrix", "validate", "--matrix", str(path)])
    assert "torchvision 0.21.0" in result.stderr
    assert "unknown SKU '800t-a2'" in result.stderr
    assert "2 error(s)" in result.stderr


def test_validate_json_reports_errors(runner: CliRunner, matrix_copy: EditMatrix) -> None:
    path = matrix_copy(("      version: 0.22.1\n", "      version: 0.21.0\n"))
    result = runner.invoke(app, ["matrix", "validate", "--json", "--matrix", str(path)])
    assert result.exit_code == ExitCode.INVALID_INPUT
    report = json.loads(result.stdout)
    assert report["valid"] is False
    (error,) = report["errors"]
    assert error["rule"] == "torchvision-matches-torch"
    assert error["field"] == "stacks.cann8.3.torchvision.version"
    assert error["line"] == line_of(path.read_text(), "version: 0.21.0")
    assert error["valid"] == "torchvision 0.22.1"


# (id, argv, text the message must contain, exit code)
BAD_INVOCATIONS: list[tuple[str, list[str], str, int]] = [
    ("unknown-hw", ["render", "--hw", "a9"], "unknown --hw 'a9'", ExitCode.INVALID_INPUT),
    (
        "chip-of-another-stack",
        ["render", "--hw", "a5", "--stack", "cann8.3"],
        "(stacks for a5: cann9.1, cann9.2; pass --stack)",
        ExitCode.INVALID_INPUT,
    ),
    ("hw-typo", ["render", "--hw", "a2-box61"], "did you mean 'a2-box16'?", ExitCode.INVALID_INPUT),
    ("unknown-stack", ["render", "--hw", "a3", "--stack", "cann8.4"], "unknown stack 'cann8.4'", ExitCode.INVALID_INPUT),
    (
        "unsupported-sku",
        ["render", "--hw", "a3", "--stack", "cann8.1"],
        "stack 'cann8.1' does not support SKU 'a3'",
        ExitCode.INVALID_INPUT,
    ),
    (
        "unsupported-os",
        ["render", "--hw", "a3", "--stack", "cann8.3", "--os", "openeuler24.03"],
        "is not built on --os 'openeuler24.03'",
        ExitCode.INVALID_INPUT,
    ),
    ("no-hw", ["render"], "give --hw", ExitCode.INVALID_INPUT),
    ("all-with-hw", ["render", "--all", "--hw", "a3"], "drop --hw", ExitCode.INVALID_INPUT),
    ("show-unknown-stack", ["matrix", "show", "cann7"], "unknown stack 'cann7'", ExitCode.INVALID_INPUT),
    ("bad-table-format", ["matrix", "table", "--format", "html"], "invalid value for '--format'", 2),
    ("unknown-option", ["render", "--bogus"], "ascendkit: render: no such option: --bogus", 2),
    ("bad-choice", ["k8s", "render", "--hw", "a3", "--image", "x", "--job", "fly"], "'fly' is not one of 'smoke', 'grpo'", 2),
    ("missing-option", ["verify", "127.0.0.1:5000/x:y"], "ascendkit: verify: missing option '--key'", 2),
    ("below-range", ["k8s", "render", "--hw", "a3", "--image", "x", "--nodes", "0"], "invalid value for '--nodes'", 2),
]


@pytest.mark.parametrize(("case", "argv", "expected", "code"), BAD_INVOCATIONS, ids=[c[0] for c in BAD_INVOCATIONS])
def test_bad_invocation(runner: CliRunner, case: str, argv: list[str], expected: str, code: int) -> None:
    result = runner.invoke(app, [*argv, "--matrix", str(MATRIX)] if argv[0] == "render" or argv[:2] == ["matrix", "show"] else argv)
    assert result.exit_code == code, result.output
    assert expected in result.output
    assert "Traceback" not in result.output
    if code == 2:  # click's usage errors take our one-line form, as ours do: no usage block, no "Error:"
        (line,) = result.output.strip().splitlines()
        assert line.startswith("ascendkit: ") and "Usage:" not in line and "Error:" not in line


def test_missing_matrix_file(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "validate", "--matrix", str(tmp_path / "nope.yaml")])
    assert result.exit_code == ExitCode.INVALID_INPUT
    assert "nope.yaml: matrix file not found" in result.stderr


def test_matrix_is_a_directory(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "list", "--matrix", str(tmp_path)])
    assert result.exit_code == ExitCode.INVALID_INPUT
    assert "is a directory" in result.stderr


@pytest.mark.parametrize(
    ("text", "expected"), [("", "the file is empty"), ("- a\n- b\n", "the top level must be a mapping"), ("\xff\xfe", "not UTF-8")]
)
def test_degenerate_files(runner: CliRunner, tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes(text.encode("latin-1"))
    result = runner.invoke(app, ["matrix", "validate", "--matrix", str(path)])
    assert result.exit_code == ExitCode.INVALID_INPUT
    assert expected in result.stderr


def test_output_into_missing_directory(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "no-such-dir" / "Dockerfile"
    result = runner.invoke(app, ["render", "--hw", "a3", "--matrix", str(MATRIX), "-o", str(out)])
    assert result.exit_code == ExitCode.OUTPUT_ERROR
    assert "does not exist" in result.stderr
    assert not out.parent.exists()


def test_output_under_a_file(runner: CliRunner, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    result = runner.invoke(app, ["render", "--hw", "a3", "--matrix", str(MATRIX), "-o", str(blocker / "Dockerfile")])
    assert result.exit_code == ExitCode.OUTPUT_ERROR
    assert "is not a directory" in result.stderr
    assert blocker.read_text() == "x"


def test_output_onto_existing_file_is_atomic(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "Dockerfile"
    out.write_text("old\n")
    result = runner.invoke(app, ["render", "--hw", "a2", "--matrix", str(MATRIX), "-o", str(out)])
    assert result.exit_code == 0
    assert out.read_text() == (ROOT / "Dockerfile.a2").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Dockerfile"]


def test_output_is_a_directory(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", "--hw", "a3", "--matrix", str(MATRIX), "-o", str(tmp_path)])
    assert result.exit_code == ExitCode.OUTPUT_ERROR
    assert "is a directory" in result.stderr


# ---- the real console script, as users run it ------------------------------------------------


def _ascendkit(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("ascendkit")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, check=False)


def test_console_script_bad_matrix_has_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "compat_matrix.yaml"
    bad.write_text(MATRIX_TEXT.replace("      version: 0.22.1\n", "      version: 0.21.0\n", 1))
    proc = _ascendkit("render", "--hw", "a3", "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == ExitCode.INVALID_INPUT
    assert "torchvision 0.21.0 does not match torch 2.7.1" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not (tmp_path / "out").exists()


def test_console_script_default_matrix_is_cwd(tmp_path: Path) -> None:
    """./compat_matrix.yaml when it is there; without it, commands that only read the matrix read the
    released one and say so, while commands that write beside it (or need its locks) refuse."""
    (tmp_path / "compat_matrix.yaml").write_text(MATRIX_TEXT)
    here = _ascendkit("matrix", "list", cwd=tmp_path)
    assert here.returncode == 0, here.stderr
    assert "released" not in here.stderr and str(tmp_path) not in here.stderr, "the working directory's matrix comes first"
    empty = tmp_path / "empty"
    empty.mkdir()
    released = _ascendkit("matrix", "list", "--json", cwd=empty)
    assert released.returncode == 0, released.stderr
    assert f"no ./compat_matrix.yaml here; reading the matrix released with ascendkit {__version__} ({MATRIX})" in released.stderr
    assert '"cann8.3"' in released.stdout
    for argv in (["render", "--hw", "a3"], ["plan", "--all"], ["lock", "--stack", "cann8.3"]):
        proc = _ascendkit(*argv, cwd=empty)
        assert proc.returncode == ExitCode.INVALID_INPUT, argv
        assert "compat_matrix.yaml: matrix file not found (pass --matrix PATH" in proc.stderr, argv
    named = _ascendkit("matrix", "list", "--matrix", "compat_matrix.yaml", cwd=empty)
    assert named.returncode == ExitCode.INVALID_INPUT, "a matrix the user named is never replaced"


def test_console_script_acceptance_render(tmp_path: Path) -> None:
    proc = _ascendkit("render", "--hw", "a3", "--stack", "cann9.1", "-o", str(tmp_path / "x"))
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "x").read_text()
    assert "ARG BASE_IMAGE=${BASE_REGISTRY}/cann:9.1.0-a3-ubuntu22.04-py3.12\n" in text
    assert "torch-npu==2.10.0.post4" in text


def test_version_and_help() -> None:
    assert _ascendkit("--version").stdout.startswith("ascendkit ")
    help_text = _ascendkit("--help").stdout
    for command in ("matrix", "render"):
        assert command in help_text


def test_start_up_loads_none_of_the_pipeline() -> None:
    """`ascendkit --help` stays fast because the commands import the pipeline only when they run
    (benchmarks/bench_cli.py measures the time; this keeps the cause from coming back)."""
    heavy = ("docker", "requests", "pydantic", "jinja2", "yaml", "jsonschema", "matplotlib", "kubernetes_validate", "packaging")
    probe = (
        "import sys, runpy; sys.argv = ['ascendkit', '--help']\n"
        "try:\n    runpy.run_module('buildkit', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "Usage: ascendkit" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_exit_code_is_in_the_readme_table_and_the_help() -> None:
    """The codes a script can rely on: the README's table and `--help` list exactly the ExitCode values."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Exit codes\n", 1)[1].strip().split("\n\n", 1)[0]
    assert sorted(int(code) for code in re.findall(r"^\| (\d+) \|", section, re.M)) == sorted(int(c) for c in ExitCode)
    epilog = app.info.epilog or ""
    for code in ExitCode:
        assert re.search(rf"(^|[ :,]){int(code)} ", epilog), f"{int(code)} is not in the --help epilog"


# ---- the command table: --help lists the commands without importing them ---------------------------

CMD_MODULES = sorted(p.stem for p in (ROOT / "buildkit" / "cli").glob("*_cmd.py"))
# `python -m buildkit ARGS` inside a script that can say afterwards which modules it imported
LOADED = (
    "import sys, runpy; sys.argv = ['ascendkit', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('buildkit', run_name='__main__')\nexcept SystemExit:\n    pass\n"
)


def _py(code: str, *argv: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, check=False, timeout=60)


def test_the_command_table_names_every_command_and_its_module() -> None:
    """COMMANDS against what the modules register: every command, the modules it needs, in --help's order."""
    import importlib

    import typer.main

    from buildkit.cli.base import app
    from buildkit.cli.commands import COMMANDS

    owners: dict[str, list[str]] = {}
    for name in CMD_MODULES:
        module = importlib.import_module(f"buildkit.cli.{name}")
        registered = {c.name for c in app.registered_commands if c.callback and c.callback.__module__ == module.__name__}
        registered |= {g.name for g in app.registered_groups if g.typer_instance and _defined_in(g.typer_instance, module.__name__)}
        for command in registered:
            owners.setdefault(str(command), []).append(module.__name__)
    group: Any = typer.main.get_group(app)
    assert list(COMMANDS) == group.list_commands(None), "the table lists every command, in the order Typer would"
    for command, (modules, _) in COMMANDS.items():
        assert set(owners.get(command, [])) <= set(modules), (command, owners.get(command))
    assert set(COMMANDS["matrix"][0]) == {"buildkit.cli.matrix_cmd", "buildkit.cli.outdated_cmd"}, "both add matrix subcommands"


def _defined_in(instance: Any, module: str) -> bool:
    return any(c.callback and c.callback.__module__ == module for c in instance.registered_commands)


@pytest.mark.parametrize("columns", [80, 200])
def test_the_listing_is_the_one_the_loaded_command_prints(columns: int) -> None:
    lazy = _py(LOADED, "--help", columns=columns)
    everything = "".join(f"import buildkit.cli.{m}\n" for m in CMD_MODULES)
    eager = _py(everything + LOADED, "--help", columns=columns)
    assert lazy.returncode == eager.returncode == 0, lazy.stderr + eager.stderr
    assert "Commands:" in lazy.stdout and lazy.stdout == eager.stdout


def test_help_imports_no_command_and_a_command_only_its_own() -> None:
    show = "\nprint('LOADED', sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('buildkit.cli.') and m.endswith('_cmd')))"
    top = _py(LOADED + show, "--help")
    assert "LOADED []" in top.stdout, top.stdout[-300:]
    render = _py(LOADED + show, "render", "--help")
    assert "LOADED ['render_cmd']" in render.stdout and "--hw" in render.stdout
    matrix = _py(LOADED + show, "matrix", "--help")
    assert "LOADED ['matrix_cmd', 'outdated_cmd']" in matrix.stdout and "outdated" in matrix.stdout
    wrong = _py(LOADED, "rendr")
    assert "ascendkit: no such command 'rendr'. Did you mean 'render'? (see `ascendkit --help`)" in wrong.stderr, (
        "suggested from every command, loaded or not"
    )


def test_runs_in_one_process_convert_the_app_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run of the app makes a group of its own (Typer's own conversion); the commands it looks up
    come from one conversion per process and set of registered commands, not one per run."""
    import typer.main

    from buildkit.cli.base import LazyGroup

    monkeypatch.setattr(LazyGroup, "_built", None)
    groups: list[object] = []
    convert = typer.main.get_group

    def counted(typer_instance: typer.Typer) -> Any:
        groups.append(typer_instance)
        return convert(typer_instance)

    monkeypatch.setattr(typer.main, "get_group", counted)
    runner = CliRunner()
    for _ in range(3):
        result = runner.invoke(app, ["render", "--hw", "a3", "--matrix", str(MATRIX)])
        assert result.exit_code == 0 and "FROM " in result.stdout
    assert len(groups) == 3 + 1, "Typer's conversion for each run, and the commands' once"


def test_the_reference_page_is_the_app_and_every_option_says_what_to_type() -> None:
    """docs/cli.md is what the app declares (render --check guards the committed page), and no option
    shows a bare type where the user needs to know what to type."""
    from buildkit.cli.commands import COMMANDS, SUMMARIES
    from buildkit.cli.reference import cli_reference

    page = cli_reference()
    assert page == (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"## `ascendkit {name}`" in page and SUMMARIES[name] in page
    options = re.findall(r"^\| `(-[^`]*)` \|", page, re.M)
    assert len(options) > 100
    assert not [o for o in options if re.search(r"<(str|int|float|path|file|dir|list\[[a-zA-Z]+\]|int range|float range)>", o)]
    assert "--job <smoke\\|grpo\\|sft\\|train\\|preflight\\|prepull>" in page
    assert page.count("`--arch <aarch64\\|x86_64>`") == page.count("`--arch ") > 3, "every --arch offers the two choices"
    for summary in SUMMARIES.values():
        assert summary.endswith(".") and len(summary) <= 60, summary


def test_piped_tables_are_plain_columns() -> None:
    """`ascendkit plan --all | cat`: aligned columns with no box drawing, each row on one line."""
    exe = Path(sys.executable).with_name("ascendkit")
    proc = subprocess.run([str(exe), "plan", "--all"], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("image(s) of compat_matrix.yaml") and lines[1].split()[:4] == ["stack", "chip", "os", "arch"]
    assert not any(ch in proc.stdout for ch in "│┃━─┏└")
    assert all(len(line.split()) >= 8 for line in lines[2:]), "one row per line, never wrapped"


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("ascendkit bu", ["build"]),
        ("ascendkit k8s render --job ", ["smoke", "grpo", "sft", "train", "preflight", "prepull"]),
        ("ascendkit build --arch ", ["aarch64", "x86_64"]),
        ("ascendkit build --media-types ", ["docker", "oci"]),
    ],
)
def test_tab_completion_offers_commands_and_choices(words: str, expected: list[str]) -> None:
    """What `ascendkit --install-completion` wires into the shell: commands (loaded or not) and choices."""
    exe = Path(sys.executable).with_name("ascendkit")
    cword = len(words.split()) if words.endswith(" ") else len(words.split()) - 1  # the word being completed
    env = {**os.environ, "_ASCENDKIT_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    proc = subprocess.run([str(exe)], capture_output=True, text=True, env=env, check=False, timeout=60)
    assert proc.stdout.split() == expected, proc.stderr


def _every_command() -> list[tuple[str, Any]]:
    """(path, command) for every command and subcommand, each as `ascendkit ... --help` loads it."""
    import typer

    from buildkit.cli.reference import load_app

    found: list[tuple[str, Any]] = []
    pending: list[tuple[str, Any, Any]] = [("ascendkit", load_app(), None)]
    while pending:
        path, command, parent = pending.pop()
        found.append((path, command))
        ctx = typer.Context(command, info_name=path.split()[-1], parent=parent)
        for name in command.list_commands(ctx) if hasattr(command, "list_commands") else []:
            pending.append((f"{path} {name}", command.get_command(ctx, name), ctx))
    return found


def test_no_help_shows_a_python_type() -> None:
    """Every parameter's help line says what to type (IMAGE, <FILE>, <SKU>), never ``<str>`` or ``<list[str]>``."""
    import typer

    python_type = re.compile(r"<(str|int|float|bool|file|path|dir|text)>|list\[|<int range>|<float range>")
    for path, command in _every_command():
        ctx = typer.Context(command, info_name=path.split()[-1])
        for param in command.params:
            record = param.get_help_record(ctx)
            if record is not None:
                assert not python_type.search(record[0]), f"{path}: {record[0]!r}"


def test_the_sku_and_stack_lists_in_help_are_the_matrix() -> None:
    import typer

    from buildkit.matrix.load import load_matrix

    matrix = load_matrix(ROOT / "compat_matrix.yaml").matrix
    helps = {
        (path, p.name): (p.get_help_record(typer.Context(command, info_name=path.split()[-1])) or ("", ""))[1]
        for path, command in _every_command()
        for p in command.params
    }  # as --help shows them
    listed_skus = [text for (_, name), text in helps.items() if name == "hw" and ("SKU:" in text or "SKU (" in text)]
    assert len(listed_skus) >= 4
    for text in listed_skus:
        assert ", ".join(matrix.skus) in text, text
    assert ", ".join(sorted(matrix.stacks, key=lambda s: not matrix.stacks[s].default)) in helps[("ascendkit matrix show", "stack")]


def test_a_chip_only_one_stack_builds_renders_with_it_and_says_so(tmp_path: Path) -> None:
    """The default stack does not build the chip, exactly one other does: that one, said on stderr."""
    from buildkit.matrix.load import load_matrix
    from buildkit.plan.targets import default_stack_for

    # the shipped matrix with the 950 SKUs (chip a5) left to cann9.1 alone, as it was before cann9.2 took them too
    text = (ROOT / "compat_matrix.yaml").read_text()
    start = text.index("\n  cann9.2:\n")
    skus = '    skus: [a2-box16, 900-podc, a3, 950-superpod, "850", "350"]\n'
    text = text[:start] + text[start:].replace(skus, "    skus: [a2-box16, 900-podc, a3]\n", 1)
    (tmp_path / "compat_matrix.yaml").write_text(text)
    for beside in ("locks", "upstream"):
        (tmp_path / beside).symlink_to(ROOT / beside)
    loaded = load_matrix(tmp_path / "compat_matrix.yaml")
    default = loaded.default_stack()
    chips = {sku.chip for sku in loaded.matrix.skus.values()}
    alone = [
        (chip, able[0])
        for chip in sorted(chips)
        if chip not in loaded.matrix.stack_chips(loaded.matrix.stacks[default])
        and len(able := [s for s, st in loaded.matrix.stacks.items() if chip in loaded.matrix.stack_chips(st)]) == 1
    ]
    assert alone, "the default stack builds every chip, or no chip has one stack alone"
    chip, only = alone[0]
    assert default_stack_for(loaded, chip) == (
        only,
        f"--hw {chip}: the default stack {default!r} builds none of it; using {only!r}, the one stack that does",
    )
    result = _ascendkit("render", "--hw", chip, "-o", str(tmp_path / "Dockerfile"), "--matrix", str(tmp_path / "compat_matrix.yaml"))
    assert result.returncode == 0, result.stderr
    assert f"using {only!r}, the one stack that does" in result.stderr
    assert f"# Stack {only}:" in (tmp_path / "Dockerfile").read_text()


def test_the_compression_flag_offers_what_publishing_knows() -> None:
    """--compression's choices are the names of the ship layer's one Compression type, passed as they are."""
    from typing import get_args

    from buildkit.cli.ship_options import CompressionOption
    from buildkit.ship.layers.compressing import PUBLISHED
    from buildkit.ship.options import ship_options

    (choices, _) = get_args(CompressionOption)
    assert set(get_args(choices)) == set(PUBLISHED)
    assert [c.name for c in ship_options(None, "zstd").compressions] == ["gzip", "zstd"]
