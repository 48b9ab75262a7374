"""The GitLab pipeline (buildkit/ci/gitlab.py): the file a project includes, the same whatever the matrix holds, and
the child pipeline `plan --ci gitlab` writes from the plan; both held to GitLab's own CI schema (check-jsonschema's
vendored copy), each planted defect caught, and every `ascendkit` line parsed by the real CLI."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from buildkit import generate
from buildkit.ci.gitlab import CHILD_FILE, GITLAB_FILE, child_pipeline, dump, render_gitlab
from buildkit.ci.workflow import job_id
from buildkit.cli import app
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.plan import plan_fleet
from tests.conftest import MATRIX, ROOT
from tests.test_workflow import parse

BIN = Path(sys.executable).parent
TEST_MATRIX = ROOT / "tests" / "fixtures" / "test_matrix.yaml"
SAMPLE_ENV = {
    "ASCENDKIT_STACKS": "all",
    "ASCENDKIT_REGISTRY": "registry.example.com/ml",
    "IMAGE": "registry.example.com/ml/verl@sha256:" + "a" * 64,
    "ASCENDKIT_SMOKE_MODEL": str(ROOT / "smoke_tests"),
}


def gitlab_schema(path: Path) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.gitlab-ci", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def test_the_included_file_is_the_rendered_one_and_the_same_for_every_matrix(loaded: LoadedMatrix) -> None:
    assert (ROOT / GITLAB_FILE).read_text(encoding="utf-8") == render_gitlab(loaded)
    assert render_gitlab(load_matrix(TEST_MATRIX)) == render_gitlab(loaded), "the jobs are computed when it runs"
    parent = yaml.safe_load((ROOT / GITLAB_FILE).read_text(encoding="utf-8"))
    plan = parent["ascendkit-plan"]
    assert plan["script"][-1] == f'ascendkit plan --ci gitlab --stacks "$ASCENDKIT_STACKS" > {CHILD_FILE}'
    assert parent["ascendkit-images"]["trigger"]["include"] == [{"artifact": CHILD_FILE, "job": "ascendkit-plan"}]


@pytest.mark.parametrize("matrix", [MATRIX, TEST_MATRIX], ids=["shipped", "test"])
def test_both_files_pass_gitlabs_schema(matrix: Path, tmp_path: Path) -> None:
    child = tmp_path / CHILD_FILE
    child.write_text(dump(child_pipeline(load_matrix(matrix))), encoding="utf-8")
    for path in (ROOT / GITLAB_FILE, child):
        proc = gitlab_schema(path)
        assert proc.returncode == 0, f"{path.name}:\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize(
    ("defect", "old", "new", "finding"),
    [
        ("a key GitLab does not know", "  stage: plan\n", "  stage: plan\n  retries: 3\n", "retries"),
        ("a trigger that is not one", "    strategy: depend\n", "    strategy: wait\n", "strategy"),
    ],
)
def test_each_planted_defect_is_caught(tmp_path: Path, defect: str, old: str, new: str, finding: str) -> None:
    text = (ROOT / GITLAB_FILE).read_text(encoding="utf-8")
    assert old in text, f"test setup: {old!r}"
    planted = tmp_path / "planted.gitlab-ci.yml"
    planted.write_text(text.replace(old, new, 1), encoding="utf-8")
    proc = gitlab_schema(planted)
    assert proc.returncode != 0 and finding in proc.stdout + proc.stderr, f"{defect}:\n{proc.stdout[-1500:]}"


def test_the_child_has_a_job_per_image_index_smoke_and_framework(loaded: LoadedMatrix) -> None:
    child = child_pipeline(loaded)
    fleet = plan_fleet(loaded)
    builds = {name: job for name, job in child.items() if name.startswith("build-")}
    assert set(builds) == {f"build-{job_id(p.stack_id, p.chip_id, p.os_name)}-{p.arch}" for p in fleet}
    for plan in fleet:
        group = job_id(plan.stack_id, plan.chip_id, plan.os_name)
        job = builds[f"build-{group}-{plan.arch}"]
        assert job["tags"] == ["ascendkit-build", plan.arch] and job["variables"]["STACK"] == plan.stack_id
        assert f"build-{group}-{plan.arch}" in child[f"index-{group}"]["needs"]
        for sku in plan.skus:
            smoke = child[f"smoke-{group}-{sku}"]
            assert smoke["tags"] == ["ascendkit-npu", sku] and smoke["needs"] == [f"index-{group}"]
            assert smoke["rules"] == [{"if": '$ASCENDKIT_PUSH == "true" && $ASCENDKIT_SMOKE == "true"'}]
            wanted = ["grpo", "sft"] if plan.framework == "verl" else ["grpo"]
            assert [line.split("--job ")[1].split()[0] for line in smoke["script"] if "ascendkit smoke" in line] == wanted
    assert {n for n in child if n.startswith("describe-")} == {"describe-verl", "describe-openrlhf"}
    only = child_pipeline(loaded, {"cann9.0"})
    assert {n for n in only if n.startswith("build-")} == {n for n in builds if n.startswith("build-cann9_0-")}
    assert set(child_pipeline(loaded, set())) == {"stages", "nothing-to-build"}, "GitLab refuses a child without jobs"


def _lines(child: dict[str, Any]) -> list[list[str]]:
    commands = []
    for job in child.values():
        if not isinstance(job, dict) or "script" not in job:
            continue
        values = {**SAMPLE_ENV, **job.get("variables", {}), "ASCENDKIT_BUILD_ARGS": "", "ASCENDKIT_MEDIA_TYPES": "docker"}
        for line in job["script"]:
            for part in re.split(r";|\bthen\b|\belse\b|\|\|", line):
                part = part.strip()
                if part.startswith("ascendkit "):
                    expanded = re.sub(r"\$\{ASCENDKIT_MEDIA_TYPES:\+([^}]*)\}", lambda m: m[1], part.split(">", 1)[0])
                    words = shlex.split(expanded)
                    filled = (re.sub(r"\$\{?(\w+)\}?", lambda m, v=values: str(v[m[1]]), w) for w in words[1:])  # type: ignore[misc]
                    commands.append([w for w in filled if w])
    return commands


def test_every_command_line_parses(loaded: LoadedMatrix) -> None:
    parent = yaml.safe_load((ROOT / GITLAB_FILE).read_text(encoding="utf-8"))
    commands = _lines(child_pipeline(loaded)) + _lines({"ascendkit-plan": parent["ascendkit-plan"]})
    assert {argv[0] for argv in commands} == {"plan", "build", "publish", "smoke", "describe"}
    for argv in commands:
        parse(argv)
    pushes = [argv for argv in commands if "--push" in argv or "--index-only" in argv]
    assert pushes and all(argv[argv.index("--sign-key") + 1] == "env://COSIGN_PRIVATE_KEY" for argv in pushes), "signed, the key from env"
    assert all(argv[argv.index("--media-types") + 1] == "docker" for argv in pushes), "SWR or Harbor: ASCENDKIT_MEDIA_TYPES=docker"
    registries = {argv[argv.index("--registry") + 1] for argv in pushes}
    assert registries == {"registry.example.com/ml/verl", "registry.example.com/ml/openrlhf"}, "a repository per framework"


def test_secrets_reach_scripts_only_as_environment_variables(loaded: LoadedMatrix) -> None:
    text = dump(child_pipeline(loaded)) + (ROOT / GITLAB_FILE).read_text(encoding="utf-8")
    assert "$COSIGN_PRIVATE_KEY" not in text and "${COSIGN_PRIVATE_KEY" not in text and "$COSIGN_PASSWORD" not in text
    assert "--password-stdin" in text and "--password " not in text, "the registry password through stdin, never an argument"


def test_render_check_reports_a_drifted_pipeline(repo_copy: Path, runner: CliRunner) -> None:
    loaded = load_matrix(repo_copy / "compat_matrix.yaml")
    assert generate.check(loaded) == []
    path = repo_copy / GITLAB_FILE
    path.write_text(path.read_text(encoding="utf-8").replace("expire_in: 1 week", "expire_in: 1 day"), encoding="utf-8")
    diffs = generate.check(loaded)
    assert len(diffs) == 1 and f"a/{GITLAB_FILE}" in diffs[0]
    printed = runner.invoke(app, ["plan", "--ci", "gitlab", "--stacks", "cann8.3", "--matrix", str(repo_copy / "compat_matrix.yaml")])
    assert printed.exit_code == 0 and yaml.safe_load(printed.stdout)["stages"] == ["build", "index", "smoke", "describe"]
