"""The generated CI workflow: drawn from the plan, drift-checked, and held to the upstream linters.

actionlint, zizmor and GitHub's published workflow schema (check-jsonschema's vendored copy) judge
the committed file; each planted defect must be caught by the tool meant to catch it, so none of
them can pass vacuously. Every `ascendkit` command line of the workflow is parsed by the real CLI.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from buildkit import generate
from buildkit.ci.workflow import ACTIONS, MATRIX_PARTS, WORKFLOW_FILE, ci_matrix, job_id
from buildkit.cli import app
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.plan import plan_fleet
from tests.conftest import MATRIX, ROOT

WORKFLOW = ROOT / WORKFLOW_FILE
BIN = Path(sys.executable).parent


def workflow() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    return data


def run_scripts(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, step) for name, job in data["jobs"].items() for step in job["steps"] if "run" in step]


def test_every_job_takes_its_matrix_from_the_plan(loaded: LoadedMatrix) -> None:
    jobs = workflow()["jobs"]
    assert list(jobs) == ["plan", "build", "index", "smoke", "describe"]
    assert 'ascendkit plan --ci github --stacks "$STACKS"' in jobs["plan"]["steps"][-1]["run"]
    for part in MATRIX_PARTS:
        job = jobs[part]
        assert job["strategy"] == {"fail-fast": False, "matrix": f"${{{{ fromJSON(needs.plan.outputs.{part}) }}}}"}
        assert job["runs-on"] == "${{ matrix.runner }}" and "plan" in job["needs"]
        assert f"needs.plan.outputs.{part}-count != '0'" in job["if"], "GitHub refuses an empty matrix: the job is skipped instead"
    assert jobs["index"]["needs"] == ["plan", "build"] and jobs["smoke"]["needs"] == ["plan", "index"]
    matrix = ci_matrix(loaded)
    fleet = plan_fleet(loaded)
    built = sorted((e["stack"], e["chip"], e["os"], e["arch"]) for e in matrix["build"])
    assert built == sorted((p.stack_id, p.chip_id, p.os_name, p.arch) for p in fleet)
    for entry in matrix["build"]:
        assert entry["runner"] == list(loaded.matrix.ci.build_runners[entry["arch"]])  # native, per arch
    groups = {job_id(p.stack_id, p.chip_id, p.os_name) for p in fleet}
    assert sorted(e["group"] for e in matrix["index"]) == sorted(groups)
    assert {(e["group"], e["sku"]) for e in matrix["smoke"]} == {
        (job_id(p.stack_id, p.chip_id, p.os_name), s) for p in fleet for s in p.skus
    }
    assert all("self-hosted" in e["runner"] for e in matrix["smoke"]) and "inputs.smoke" in jobs["smoke"]["if"]
    assert [e["framework"] for e in matrix["describe"]] == ["openrlhf", "verl"]


def test_the_workflow_does_not_grow_with_the_matrix(repo_copy: Path, runner: CliRunner) -> None:
    """A stack added to a copy of the repository: the plan grows, the regenerated workflow is the same file."""
    matrix = repo_copy / "compat_matrix.yaml"
    text = matrix.read_text(encoding="utf-8")
    start = text.index("  cann9.0:\n")
    block = text[start : text.index("\n  cann9.1:\n", start) + 1]
    matrix.write_text(text.replace(block, block + block.replace("  cann9.0:\n", "  cann9.0-again:\n", 1), 1), encoding="utf-8")
    before = WORKFLOW.read_text(encoding="utf-8")
    generate.write_all(load_matrix(matrix))
    assert (repo_copy / WORKFLOW_FILE).read_text(encoding="utf-8") == before
    grown = ci_matrix(load_matrix(matrix))
    shipped = ci_matrix(load_matrix(MATRIX))
    assert len(grown["build"]) == len(shipped["build"]) + 4 and len(grown["smoke"]) == len(shipped["smoke"]) + 3
    assert len(before.splitlines()) < 400, "the workflow is small: its jobs are computed, not written out"
    listed = runner.invoke(app, ["plan", "--ci", "github", "--stacks", "cann9.0-again,cann8.3", "--matrix", str(matrix)])
    assert listed.exit_code == 0, listed.output
    assert {e["stack"] for e in json.loads(listed.stdout)["build"]} == {"cann9.0-again", "cann8.3"}
    wrong = runner.invoke(app, ["plan", "--ci", "github", "--stacks", "cann9.9", "--matrix", str(matrix)])
    assert wrong.exit_code == 2 and "no stack cann9.9" in wrong.stderr


def test_each_image_runs_the_smoke_jobs_of_its_framework(loaded: LoadedMatrix) -> None:
    """verl images: GRPO then SFT (which runs even when GRPO failed; each has its report); OpenRLHF: GRPO."""
    for entry in ci_matrix(loaded)["smoke"]:
        assert entry["jobs"] == ("grpo sft" if entry["framework"] == "verl" else "grpo"), entry
    steps = workflow()["jobs"]["smoke"]["steps"]
    runs = [s for s in steps if "smoke test on the NPUs" in s.get("name", "")]
    assert [s["run"].split("--job ")[1].split()[0] for s in runs] == ["grpo", "sft"]
    assert runs[0]["if"] == "contains(format(' {0} ', matrix.jobs), ' grpo ')"
    assert runs[1]["if"] == "!cancelled() && contains(format(' {0} ', matrix.jobs), ' sft ')"
    assert all(f"--out smoke-out/{job}" in s["run"] for job, s in zip(["grpo", "sft"], runs, strict=True))


def test_hardening_that_the_linters_do_not_decide_alone() -> None:
    data = workflow()
    assert data["permissions"] == {}
    text = WORKFLOW.read_text(encoding="utf-8")
    for line in text.splitlines():
        if "uses:" in line:
            assert re.search(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40}  # v\d+\.\d+\.\d+$", line), line
    assert {m for m in re.findall(r"uses: ([\w.-]+/[\w.-]+)@", text)} == {repo for repo, _, _ in ACTIONS.values()}
    for name, job in data["jobs"].items():
        pushes = any("--push" in s["run"] or "ascendkit publish" in s["run"] for _, s in run_scripts({"jobs": {name: job}}))
        assert job["permissions"].get("packages") == ("write" if pushes else None), name
        assert "write" not in {v for k, v in job["permissions"].items() if k != "packages"}, name
    for name, step in run_scripts(data):
        assert "${{" not in step["run"], f"{name}: an expression inside run: (pass it through env:)"


def test_render_check_reports_a_drifted_workflow(repo_copy: Path) -> None:
    loaded = load_matrix(repo_copy / "compat_matrix.yaml")
    assert generate.check(loaded) == []
    path = repo_copy / WORKFLOW_FILE
    path.write_text(path.read_text(encoding="utf-8").replace("--quiet", "--quiet --no-cache", 1), encoding="utf-8")
    diffs = generate.check(loaded)
    assert len(diffs) == 1 and f"a/{WORKFLOW_FILE}" in diffs[0] and "--no-cache" in diffs[0]
    path.unlink()
    assert any(f"b/{WORKFLOW_FILE}" in d for d in generate.check(loaded))
    generate.write_all(loaded)
    assert path.read_text(encoding="utf-8") == WORKFLOW.read_text(encoding="utf-8")


# ---- the upstream linters -----------------------------------------------------------------------


def actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    config = ROOT / ".github" / "actionlint.yaml"
    argv = [str(BIN / "actionlint"), "-config-file", str(config), "-shellcheck", str(BIN / "shellcheck"), "-pyflakes=", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def zizmor(path: Path) -> subprocess.CompletedProcess[str]:
    config = ROOT / ".github" / "zizmor.yml"
    argv = [str(BIN / "zizmor"), "--offline", "--config", str(config), "--persona", "pedantic", "--min-severity", "medium", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def schema(path: Path) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def test_the_committed_workflow_passes_every_linter() -> None:
    for tool in (actionlint, zizmor, schema):
        proc = tool(WORKFLOW)
        assert proc.returncode == 0, f"{tool.__name__}:\n{proc.stdout}\n{proc.stderr}"


CHECKOUT = "actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1  # v7.0.1"
FIRST_BUILD = 'ascendkit build --hw "$CHIP" --stack "$STACK" --os "$OS" --arch "$ARCH" --quiet\n'


@pytest.mark.parametrize(
    ("defect", "old", "new", "tool", "finding"),
    [
        ("an action pinned by tag", CHECKOUT, "actions/checkout@v7.0.1", zizmor, "unpinned-uses"),
        ("needs: on a missing job", "    needs:\n", "    needs:\n    - build-no-such-job\n", actionlint, "build-no-such-job"),
        (
            "an untrusted expression in run:",
            FIRST_BUILD,
            'echo "${{ inputs.stacks }}"\n        ' + FIRST_BUILD,
            zizmor,
            "template-injection",
        ),
        ("a write permission at the top", "permissions: {}\n", "permissions:\n  contents: write\n", zizmor, "excessive-permissions"),
        ("a key GitHub does not know", "    timeout-minutes: 30\n", "    timeout-minutes: 30\n    retries: 3\n", schema, "retries"),
    ],
)
def test_each_planted_defect_is_caught(tmp_path: Path, defect: str, old: str, new: str, tool: Any, finding: str) -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    assert old in text, f"test setup: {old!r}"
    planted = tmp_path / "images.yml"
    planted.write_text(text.replace(old, new, 1), encoding="utf-8")
    proc = tool(planted)
    assert proc.returncode != 0, f"{tool.__name__} missed {defect}"
    assert finding in proc.stdout + proc.stderr, f"{tool.__name__} on {defect}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"


# ---- every ascendkit command line of the workflow exists -----------------------------------------

SAMPLE_ENV = {
    "STACKS": "all",  # the workflow's input
    "ASCENDKIT_REGISTRY": "registry.example.com/ml",
    "IMAGE": "registry.example.com/ml/verl@sha256:" + "a" * 64,
    "ASCENDKIT_SMOKE_MODEL": str(ROOT / "smoke_tests"),  # smoke checks the directory exists; the weights are on the NPU host
}


def command_lines() -> list[list[str]]:
    """Every `ascendkit ...` command the workflow runs, once per entry of its job's matrix (as `plan --ci github`
    computes it), split as bash would, with the entry's and sample env values in place of the variables."""
    data, matrix = workflow(), ci_matrix(load_matrix(MATRIX))
    commands = []
    for name, step in run_scripts(data):
        entries = matrix.get(name, [{}])
        for entry in entries:
            values = {**SAMPLE_ENV, **{key: str(entry[key.lower()]) for key in step.get("env", {}) if key.lower() in entry}}
            script = step["run"].replace("\\\n", " ")
            for line in script.splitlines():
                if line.strip().startswith("ascendkit "):
                    words = shlex.split(line.split(">", 1)[0])
                    commands.append([re.sub(r"\$(\w+)", lambda m, v=values: v[m[1]], w) for w in words[1:]])  # type: ignore[misc]
    return commands


@functools.cache
def _command() -> Any:
    """The click command Typer makes of the app: made once (a second or more each time), parsed with many times."""
    return typer.main.get_command(app)


def parse(argv: list[str]) -> Any:
    """Parse ``argv`` exactly as the ascendkit command would, without running it (Typer's own click)."""
    group: Any = _command()
    with group.make_context("ascendkit", argv[:1], resilient_parsing=False) as ctx:
        command = group.get_command(ctx, argv[0])
        assert command is not None, argv[0]
        return command.make_context(argv[0], argv[1:], parent=ctx)


def test_every_command_line_parses() -> None:
    commands = command_lines()
    kinds = {argv[0] for argv in commands}
    assert kinds == {"plan", "build", "publish", "smoke", "describe"}
    for argv in commands:
        parse(argv)  # an unknown flag or a bad value raises here


def test_build_command_lines_run_as_a_dry_run(runner: CliRunner) -> None:
    builds = [argv for argv in command_lines() if argv[0] == "build"]
    assert len(builds) == 2 * len(plan_fleet(load_matrix(MATRIX)))  # with and without --push
    for argv in builds:
        result = runner.invoke(app, [*argv, "--dry-run", "--json", "--no-ca-bundle", "--matrix", str(MATRIX)])
        assert result.exit_code == 0, f"{argv}: {result.output}"


def test_publish_command_line_reads_the_manifest_dir(runner: CliRunner, tmp_path: Path) -> None:
    publishes = {tuple(argv) for argv in command_lines() if argv[0] == "publish"}
    registries = {argv[argv.index("--registry") + 1] for argv in publishes}
    assert registries == {"registry.example.com/ml/verl", "registry.example.com/ml/openrlhf"}, "a repository per framework"
    empty = tmp_path / "manifests"
    empty.mkdir()
    for publish in publishes:
        argv = [str(empty) if word == "manifests" else word for word in publish]
        result = runner.invoke(app, [*argv, "--dry-run"])
        assert result.exit_code == 2 and "no build manifests" in result.stderr  # it got past parsing, to its input


def test_each_framework_repository_gets_its_overview_page_as_description() -> None:
    """After the index jobs, the page render --all writes, where the registry keeps one."""
    job = workflow()["jobs"]["describe"]
    assert job["needs"] == ["plan", "index"]
    for framework in ("verl", "openrlhf"):
        (command,) = [c for c in command_lines() if c[0] == "describe" and c[1].endswith(f"/{framework}")]
        page = command[command.index("--page") + 1]
        assert page == f"docs/repositories/{framework}.md" and (ROOT / page).is_file() and "--if-supported" in command
    assert "secrets.REGISTRY_API_TOKEN" in job["steps"][-1]["env"]["ASCENDKIT_REGISTRY_TOKEN"], "secrets reach it through env only"


def test_everything_pushed_is_signed_with_a_key_that_reaches_ascendkit_through_env_only() -> None:
    jobs = workflow()["jobs"]
    pushing = [(name, step) for name, step in run_scripts({"jobs": jobs}) if "--push" in step["run"] or "--index-only" in step["run"]]
    assert [name for name, _ in pushing] == ["build", "index"]
    for name, step in pushing:
        assert "--sign-key env://COSIGN_PRIVATE_KEY" in step["run"], name
        secrets = {k: v for k, v in step["env"].items() if "secrets." in v}
        assert secrets == {"COSIGN_PRIVATE_KEY": "${{ secrets.COSIGN_PRIVATE_KEY }}", "COSIGN_PASSWORD": "${{ secrets.COSIGN_PASSWORD }}"}
        assert all(v.startswith("${{ matrix.") for k, v in step["env"].items() if k not in secrets), "the rest: the job's matrix entry"
        assert jobs[name]["environment"] == "registry", f"{name}: the key is the registry environment's secret"
