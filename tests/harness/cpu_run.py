"""The CPU run of every stack's smoke jobs in its own packages, on this machine (``make cpu-run``; CI's ``cpu-run`` job).

    python -m tests.harness.cpu_run [--stack S ...] [--all] [--out DIR] [--work DIR] [--torch-wheel WHEEL]

Without ``--stack`` or ``--all``: the default stack and the newest stack of each framework that has a CPU
run. For each stack: its CPU environment (:mod:`buildkit.run.cpuenv`), then each of its framework's jobs
run to the accelerator boundary and, where the framework has one, one training step
(:mod:`buildkit.run.cpurun`), judged; ``cpu-report.md`` and ``.json`` in ``--out``. Exits 1 naming
stack, job and step when one failed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from buildkit.errors import AscendkitError, InputError
from buildkit.framework import framework
from buildkit.frameworks.verl.releases import older
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.resources import DEFAULT_MATRIX
from buildkit.run.cpuenv import CpuEnvPlan, make_env, plan_env
from buildkit.run.cpurun import CpuRun, LocalPlace, Variation, run_cpu, write_report
from buildkit.run.job import ImageJob, JobFacts
from tests.harness.cpu_team import run_team
from tests.harness.openrlhf_standin import fork_archive, vendored

FRAMEWORKS_WITH_A_CPU_RUN = ("verl", "openrlhf")
TORCH_WHEELS = "/opt/wheels/torch-*+cpu-cp311-*.whl"  # where these machines keep a CPU build of torch for CPython 3.11


def default_stacks(loaded: LoadedMatrix) -> list[str]:
    """The default stack and, per framework with a CPU run, its newest stack (the last of the matrix)."""
    stacks = loaded.matrix.stacks
    chosen = [sid for sid, st in stacks.items() if st.default]
    for name in FRAMEWORKS_WITH_A_CPU_RUN:
        ours = [sid for sid, st in stacks.items() if st.framework == name and st.rollout == "vllm"]  # verl's SGLang line: --all
        if ours and ours[-1] not in chosen:
            chosen.append(ours[-1])
    return chosen


# A reward function with another signature than verl's reward manager calls (it passes data_source, solution_str,
# ground_truth and extra_info by keyword).
BAD_REWARD = "def compute_score(solution, truth):\n    return 0.0\n"
# A module the trainer imports only when its task runner starts (verl's FSDP workers import peft), missing.
MISSING_MODULE = "raise ModuleNotFoundError(\"No module named 'peft'\", name='peft')\n"
DROP_PROMPT = (
    "import sys, pyarrow.parquet as pq\nfor path in sys.argv[1:]:\n    pq.write_table(pq.read_table(path).drop(['prompt']), path)\n"
)


def plants(work: Path, job_work: str, reward_key: str) -> list[tuple[str, str, Variation]]:
    """Each failure class planted in a copy of the job: (what, the kind the check must name, how); ``reward_key``: the
    section where the stack's verl reads the job's reward function."""
    (work / "planted").mkdir(parents=True, exist_ok=True)
    (work / "planted" / "bad_reward.py").write_text(BAD_REWARD, encoding="utf-8")
    (work / "planted" / "peft").mkdir(exist_ok=True)
    (work / "planted" / "peft" / "__init__.py").write_text(MISSING_MODULE, encoding="utf-8")
    (work / "planted" / "drop_prompt.py").write_text(DROP_PROMPT, encoding="utf-8")
    data = [f"{job_work}/data/train.parquet", f"{job_work}/data/test.parquet"]
    return [
        (
            "a reward function with another signature",
            "reward",
            Variation(
                overrides=(
                    f"{reward_key}.path={work / 'planted' / 'bad_reward.py'}",
                    f"{reward_key}.name=compute_score",
                ),
                boundary=False,
            ),
        ),
        (
            "a data file without its prompt column",
            "data",
            Variation(after_setup=(("python3", str(work / "planted" / "drop_prompt.py"), *data),), step=False),
        ),
        (
            "a module the trainer imports at start missing (peft)",
            "import",
            Variation(env=(("PYTHONPATH", str(work / "planted")),), step=False),
        ),
        (
            "a configuration key the trainer refuses at start",
            "configuration",
            Variation(overrides=("actor_rollout_ref.actor.optim.lr_typo=1e-6",), step=False),
        ),
    ]


def run_plants(loaded: LoadedMatrix, stack_id: str, env_python: Path, work: Path) -> list[dict[str, object]]:
    """The check run on each planted failure; each must be named, with its kind and place."""
    stack = loaded.matrix.stacks[stack_id]
    sku = loaded.matrix.skus[stack.skus[0]]
    # verl 0.9 on reads the reward function only under reward: (compat.verl_legacy_reward_ignored); older ones read, or
    # have main_ppo move, the top-level key
    unread = not older(stack.framework_version, loaded.matrix.compat.verl_legacy_reward_ignored)
    reward_key = "reward.custom_reward_function" if unread else "custom_reward_function"
    found = []
    for number, (name, expected, variation) in enumerate(plants(work, str(work / f"{stack_id}-planted-{{}}"), reward_key)):
        job_work = work / f"{stack_id}-planted-{number}"
        shutil.rmtree(job_work, ignore_errors=True)
        job_work.mkdir(parents=True)
        for made in ("model", "data"):  # the first run's, copied: a plant changes its copy, nothing is made twice
            shutil.copytree(work / f"{stack_id}-grpo" / made, job_work / made)
        after = tuple(tuple(a.format(number) for a in c) for c in variation.after_setup)
        # the config check is left out: a plant is there for the entry point's own run to name it
        variation = replace(variation, after_setup=after, prepare=False, check=False)
        place = LocalPlace(env_python, job_work, description=f"CPU environment of {stack_id}, planted: {name}")
        run = run_cpu(place, job_work, ImageJob.of(stack_id, stack), "grpo", sku, JobFacts.of(loaded.matrix.compat), variation=variation)
        verdict = run.boundary if variation.boundary and not run.boundary.reached else run.step if run.step is not None else run.boundary
        named = not verdict.reached and verdict.kind == expected and run.failure() is not None
        said = run.failure() or "nothing: the run passed"
        print(f"cpu-run: planted {name}: {'named' if named else 'NOT NAMED'}: {said}", file=sys.stderr, flush=True)
        found.append({"name": name, "expected": expected, "named": named, "kind": verdict.kind, "said": said})
    return found


def framework_tree(loaded: LoadedMatrix, stack_id: str, work: Path) -> Path | None:
    """The framework's source tree where the stack builds it from git: the vendored archive of that commit (CI cannot
    reach the git host), unpacked."""
    source = loaded.matrix.stacks[stack_id].framework_source
    if source is None:
        return None
    archive = fork_archive()
    commit = next(e["commit"] for e in vendored() if e["file"] == archive.name)
    if commit != source.ref:
        raise InputError(f"{stack_id}: no vendored source of {source.repo} at {source.ref} (tests/fixtures/upstream has {commit})")
    tree = work / f"{stack_id}-source"
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    with tarfile.open(archive) as unpack:
        unpack.extractall(tree, filter="data")
    return tree / "openrlhf-ascend"


def run_stack(
    loaded: LoadedMatrix, stack_id: str, out: Path, work: Path, torch_wheel: Path, python: str
) -> tuple[CpuEnvPlan, list[CpuRun]]:
    stack = loaded.matrix.stacks[stack_id]
    say = sayer(stack_id)
    started = time.monotonic()
    plan = plan_env(loaded, stack_id, torch_wheel, work / f"{stack_id}-resolve", framework_tree(loaded, stack_id, work))
    say(f"{len(plan.requirements)} packages of the image ({plan.source}); left out: {', '.join(n for n, _, _ in plan.left_out)}")
    env_python = make_env(plan, work / f"{stack_id}-venv", python)
    say(f"environment ready in {time.monotonic() - started:.0f} s")
    sku = loaded.matrix.skus[stack.skus[0]]
    image = ImageJob.of(stack_id, stack)
    runs = []
    for job in framework(stack.framework).jobs:
        job_work = work / f"{stack_id}-{job}"
        job_work.mkdir(parents=True, exist_ok=True)
        place = LocalPlace(env_python, job_work, description=f"CPU environment of {stack_id} ({plan.source}), CPython 3.11")
        runs.append(
            run_cpu(place, job_work, image, job, sku, JobFacts.of(loaded.matrix.compat), left_out=plan.left_out_report(), progress=say)
        )
    return plan, runs


def sayer(what: str) -> Callable[[str], None]:
    """Progress on stderr, each line headed by what it is of."""

    def say(line: str) -> None:
        print(f"cpu-run: {what}: {line}", file=sys.stderr, flush=True)

    return say


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", action="append", default=[])
    parser.add_argument("--all", action="store_true", help="every stack whose framework has a CPU run")
    parser.add_argument("--out", type=Path, default=Path("cpu-run-out"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/ascendkit-cpu-run"))
    parser.add_argument("--torch-wheel", type=Path, default=None)
    parser.add_argument("--python", default="/root/.pyenv/versions/3.11.7/bin/python3.11")
    parser.add_argument("--matrix", type=Path, default=DEFAULT_MATRIX)
    parser.add_argument("--plant", action="store_true", help="also plant each failure class in copies of the newest verl stack's job")
    parser.add_argument("--team", action="store_true", help="also the team example (tests/harness/cpu_team.py) on the default stack")
    args = parser.parse_args(argv)
    loaded = load_matrix(args.matrix)
    wheels = sorted(Path(TORCH_WHEELS).parent.glob(Path(TORCH_WHEELS).name))
    torch_wheel = args.torch_wheel or (wheels[-1] if wheels else Path(TORCH_WHEELS))
    python = args.python if Path(args.python).is_file() else sys.executable
    if args.all:
        stacks = [sid for sid, st in loaded.matrix.stacks.items() if st.framework in FRAMEWORKS_WITH_A_CPU_RUN]
    else:
        stacks = args.stack or default_stacks(loaded)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[CpuRun] = []
    planted: list[dict[str, object]] = []
    # The planted failures are verl's (its keys, its reward): in the newest verl stack run, whose job reaches its
    # boundary soonest
    verl_stacks = [sid for sid in stacks if loaded.matrix.stacks[sid].framework == "verl"]
    plant_in = verl_stacks[-1] if args.plant and verl_stacks else None
    unbuilt: list[str] = []
    team_on = next((sid for sid in stacks if loaded.matrix.stacks[sid].default), None) if args.team else None
    for stack_id in stacks:
        try:
            plan, ran = run_stack(loaded, stack_id, args.out, args.work, torch_wheel, python)
            runs += ran
        except AscendkitError as exc:  # a stack whose environment cannot be made: said, and the others still run
            unbuilt.append(f"{stack_id}: no CPU environment: {exc}")
            print(f"cpu-run: {unbuilt[-1]}", file=sys.stderr, flush=True)
            continue
        write_report(args.out, runs)
        if stack_id == plant_in:
            planted = run_plants(loaded, stack_id, args.work / f"{stack_id}-venv" / "bin" / "python", args.work)
            write_report(args.out, runs, planted)
        if stack_id == team_on:
            try:
                runs.append(run_team(loaded, stack_id, plan, args.work / "team", python, sayer(f"{stack_id} + team")))
            except AscendkitError as exc:  # the example could not be locked or installed: said, as a failure
                unbuilt.append(f"{stack_id}: team {exc}")
                print(f"cpu-run: {unbuilt[-1]}", file=sys.stderr, flush=True)
            write_report(args.out, runs, planted)
    if args.team and team_on is None:
        unbuilt.append("--team: the default stack is not among the stacks run")
    failures = [*unbuilt, *(f for run in runs if (f := run.failure()))]
    failures += [f"planted {p['name']}: the check did not name it ({p['said']})" for p in planted if not p["named"]]
    for failure in failures:
        print(f"cpu-run: FAILED: {failure}", file=sys.stderr)
    passed = sum(run.passed for run in runs)
    named = sum(bool(p["named"]) for p in planted)
    said = f"; {named} of {len(planted)} planted failures named" if planted else ""
    print(f"cpu-run: {passed} of {len(runs)} runs passed{said}; see {args.out / 'cpu-report.md'}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
