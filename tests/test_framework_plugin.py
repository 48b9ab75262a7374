"""A third RL framework is one package, a job file and matrix stanzas: nothing else changes.

The repository is copied, the stand-in ToyRL of tests/fixtures/framework-standin is added to the
copy (its plug-in package, its GRPO job file, its stack in the test matrix) and ascendkit runs from
the copy: the matrix takes its stanza and runs its rule, plan tags its images, render gives it its
layer, k8s render composes its job with its arguments, compare judges its logs by its gate, and
the smoke-job choice refuses a job it does not have. The copy differs from this checkout in those
three places only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STANDIN = ROOT / "tests" / "fixtures" / "framework-standin"
MATRIX = "tests/fixtures/test_matrix.yaml"
DIGEST_REF = "127.0.0.1:9/ascendkit/toyrl@sha256:" + "ab" * 32  # nothing listens on port 9: the labels cannot be read
ADDED = {"buildkit/frameworks/toyrl/__init__.py", "smoke_tests/toyrl_grpo_smoke.yaml"}
CHANGED = {MATRIX}


def _files(root: Path) -> list[str]:
    """The checkout's files as git sees them (tracked and new, not ignored), that exist."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root, check=True, capture_output=True
    ).stdout
    return sorted(p for p in out.decode().split("\0") if p and (root / p).is_file())


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("plugin") / "ascendkit"
    for name in _files(ROOT):
        if name.startswith("tests/fixtures/framework-standin/"):
            continue  # the stand-in goes where a contributor would put it, below
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(STANDIN / "buildkit" / "frameworks" / "toyrl", dest / "buildkit" / "frameworks" / "toyrl")
    shutil.copy2(STANDIN / "smoke_tests" / "toyrl_grpo_smoke.yaml", dest / "smoke_tests" / "toyrl_grpo_smoke.yaml")
    with (dest / MATRIX).open("a", encoding="utf-8") as out:
        out.write((STANDIN / "stack.yaml").read_text(encoding="utf-8"))
    return dest


def ascendkit(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The copy's ascendkit (its buildkit first on the path), offline."""
    env = {**os.environ, "PYTHONPATH": str(copy), "NO_COLOR": "1", "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "buildkit", *args], cwd=copy, env=env, capture_output=True, text=True, timeout=120)


def test_the_copy_differs_in_the_plugin_its_job_file_and_the_matrix_only(copy: Path) -> None:
    ours = {name: _digest(ROOT / name) for name in _files(ROOT) if not name.startswith("tests/fixtures/framework-standin/")}
    theirs = {str(p.relative_to(copy)): _digest(p) for p in copy.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert set(theirs) - set(ours) == ADDED
    assert {name for name in ours if theirs.get(name) != ours[name]} == CHANGED
    probe = ascendkit(copy, "--version")
    assert probe.returncode == 0, probe.stderr
    where = subprocess.run(
        [sys.executable, "-c", "import buildkit; print(buildkit.__file__)"],
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == str(copy / "buildkit" / "__init__.py"), "the copy's code runs, not this checkout's"


def test_the_matrix_takes_its_stanza_and_runs_its_rule(copy: Path, tmp_path: Path) -> None:
    valid = ascendkit(copy, "matrix", "validate", "--matrix", MATRIX)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    listed = ascendkit(copy, "matrix", "list", "--matrix", MATRIX)
    assert "teststack-toyrl" in listed.stdout and "toyrl 24.0" in listed.stdout
    text = (copy / MATRIX).read_text(encoding="utf-8")
    bad = tmp_path / "bad_toyrl.yaml"
    bad.write_text(text.replace('      version: "24.0"\n      package: packaging', '      version: "23.0"\n      package: packaging'))
    refused = ascendkit(copy, "matrix", "validate", "--matrix", str(bad))
    assert refused.returncode != 0
    assert "stacks.teststack-toyrl.toyrl.version: ToyRL 23.0 has no Ascend support [toyrl-release-known]" in refused.stdout + refused.stderr


def test_plan_and_render_name_and_layer_it(copy: Path) -> None:
    planned = ascendkit(copy, "plan", "--matrix", MATRIX, "--stack", "teststack-toyrl", "--json")
    assert planned.returncode == 0, planned.stderr
    (image,) = json.loads(planned.stdout)
    assert image["tags"][0].startswith("ascendkit/toyrl:toyrl24.0-cann8.3.rc1-"), image["tags"]
    dockerfile = ascendkit(copy, "render", "--matrix", MATRIX, "--stack", "teststack-toyrl", "--hw", "a3")
    assert dockerfile.returncode == 0, dockerfile.stderr
    assert "# 11. ToyRL (the most volatile layer: bumping ToyRL rebuilds only this)" in dockerfile.stdout
    assert 'io.ascendkit.framework="toyrl"' in dockerfile.stdout and 'io.ascendkit.version.toyrl="24.0"' in dockerfile.stdout


def test_k8s_composes_its_job_with_its_arguments(copy: Path) -> None:
    job_args = ("k8s", "render", "--matrix", MATRIX, "--hw", "a3", "--image", DIGEST_REF, "--stack", "teststack-toyrl")
    rendered = ascendkit(copy, *job_args, "--json")
    assert rendered.returncode == 0, rendered.stderr
    job = next(o for o in json.loads(rendered.stdout)["items"] if o["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    command = " ".join(container["args"])
    for part in ("-m toyrl.train", "--devices=16", "--nodes=1", "--batch=32", "--reward=/opt/ascendkit-smoke/gsm8k_reward.py"):
        assert part in command, command
    refused = ascendkit(copy, *job_args, "--job", "sft")
    assert refused.returncode != 0 and "--job sft: a ToyRL image has the grpo smoke job (SFT smoke jobs are verl's)" in refused.stderr
    wrong = ascendkit(copy, *job_args, "--override", "a.b=1")
    assert wrong.returncode != 0 and "this image runs ToyRL, whose arguments are flags" in wrong.stderr


def test_compare_judges_its_logs_by_its_gate(copy: Path, tmp_path: Path) -> None:
    def log(name: str, rewards: list[float]) -> Path:
        path = tmp_path / name
        lines = [f"step:{i + 1} - toy/reward:{r} - toy/loss:{0.5 - i / 100}" for i, r in enumerate(rewards)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    npu, gpu = log("npu.log", [0.10, 0.20, 0.30]), log("gpu.log", [0.12, 0.22, 0.32])
    judged = ascendkit(copy, "compare", str(npu), str(gpu), "--json")
    assert judged.returncode == 0, judged.stdout + judged.stderr
    tolerances = {name: m["tolerance_pct"] for name, m in json.loads(judged.stdout)["metrics"].items()}
    assert tolerances == {"toy/reward": 3.0, "toy/loss": 1.5}, "ToyRL's gate, not verl's or OpenRLHF's"


def test_a_plugin_without_a_gate_for_one_of_its_jobs_is_refused_when_ascendkit_starts() -> None:
    from buildkit.framework import Framework, Gate, checked, frameworks

    class Ungated(Framework):
        name = "ungated"
        title = "Ungated"
        install = "index"
        jobs = ("grpo", "sft")
        arguments = "hydra"
        check_style = "hydra"
        gates = (Gate("ungated grpo", "reward", ("loss",), None, 2.0, 2.0),)

    with pytest.raises(TypeError, match=r"x.FRAMEWORK: no gate for its sft smoke job \(gates: ungated grpo\)"):
        checked(Ungated(), "x.FRAMEWORK", "ungated")
    with pytest.raises(TypeError, match="must be a Framework named 'other'"):
        checked(Ungated(), "x.FRAMEWORK", "other")
    assert set(frameworks()) == {"openrlhf", "verl"}, "the shipped plug-ins pass the same check"
