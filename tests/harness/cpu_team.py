"""The CPU run of a team's image on a real stack: docs/team-images.md's worked example (a verl fork at a commit, swanlab
and math-verify, the team's reward function) locked by ``ascendkit team lock`` against the stack's real lock, put into
the stack's CPU environment as the team build installs it, the base held to what it was, then smoke's config check,
the GRPO job to its accelerator boundary and one GRPO step, all through the fork's code and scored by the team's reward
function. Part of ``make cpu-run`` (CI's ``cpu-run`` job), after the stack's own run.

What stands in for what, each said in the report:

- the fork: verl's own release sdist of the stack's version (from PyPI, by its sha256), committed to a git repository
  here, then a team commit adding a module the team's reward function imports (so the step scores only with the fork);
  ``framework.git`` is its ``file://`` URL: GitHub and a team's GitLab cannot be reached from CI;
- the arch of the lock: the stack's x86_64 lock is unresolved here (download.pytorch.org cannot be reached), so the team
  locks for aarch64 against the stack's resolved aarch64 lock, as a team would on an A2/A3 host; the CPU environment is
  this machine's x86_64 one. Each locked package whose locked file is a pure wheel, and the fork's wheel, is installed by
  the lock's hash; one that is not (a platform wheel) at the locked version, named;
- the image: the stack's CPU environment (:mod:`buildkit.run.cpuenv`), its distributions read before and after the
  team's install as ``team build`` reads them in the base and the team image (:mod:`buildkit.team.inimage`).

The example's packages on cann8.3: swanlab 0.6.4 asks for boto3, whose botocore caps python-dateutil below 3, where the
stack has 4.0.0 (for pandas and matplotlib): the team file names it under ``replace:`` with that reason, which is what a
team on that stack must do (without it ``team lock`` refuses, naming botocore and python-dateutil).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.utils import canonicalize_name, parse_wheel_filename

from buildkit.errors import AscendkitError, InputError
from buildkit.frameworks.verl.releases import older
from buildkit.lock.index import DistFile, IndexClient, IndexUnreachable, ProjectMissing, download
from buildkit.lock.lockfile import LockedPackage, read_lock
from buildkit.lock.resolve import uv_binary
from buildkit.matrix.load import LoadedMatrix
from buildkit.run.cpuenv import CpuEnvPlan, make_env
from buildkit.run.cpurun import CpuRun, LocalPlace, Variation, run_cpu
from buildkit.run.cpuverdict import Verdict
from buildkit.run.job import ImageJob, JobFacts
from buildkit.team.fork import WHEELS_DIR
from buildkit.team.inimage import DISTRIBUTIONS, IMPORTS, moved, shared
from buildkit.team.resolve import FORK_LAYER, TEAM_LAYER

BIN = Path(sys.executable).parent
PYPI = "https://pypi.org/simple"
TEAM = "acme/verl-math"
PACKAGES = ("swanlab==0.6.4", "math-verify==0.8.0")
LOCK_ARCH = "aarch64"  # the arch whose stack lock is resolved here (see the module's docstring)
# Each stack's escapes the example needs there, with the reason the team file gives.
REPLACE = {
    "cann8.3": {
        "python-dateutil": "swanlab's boto3 needs botocore, which caps python-dateutil below 3; the base's pandas and "
        "matplotlib take 2.9 (the team's CPU run holds them to it)"
    }
}
# The fork's own commits: fixed names and dates, so the same release gives the same commit on any machine.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "acme rl",
    "GIT_AUTHOR_EMAIL": "rl@acme.example",
    "GIT_COMMITTER_NAME": "acme rl",
    "GIT_COMMITTER_EMAIL": "rl@acme.example",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}
FORK_MODULE = "verl/utils/reward_score/acme_answer.py"
FORK_CODE = '''"""acme's fork: how the team's rewards read a response's final answer (the number after the last ####)."""

import re

_ANSWER = re.compile(r"####\\s*(-?[0-9][0-9.,]*)")


def final_answer(response: str) -> str | None:
    found = _ANSWER.findall(response[-400:])
    return found[-1].replace(",", "").rstrip(".") if found else None
'''
# The team's reward: the fork's reader, math-verify's comparison, and a format penalty a random model's responses earn
# (so the step's rewards show whose function scored them: the smoke job's own gives 0 or 1).
REWARD_CODE = '''"""acme's math reward: 1 for the right final answer, checked by math-verify; -0.5 for a response with none."""

from math_verify import parse, verify

from verl.utils.reward_score.acme_answer import final_answer

NO_ANSWER = -0.5


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = final_answer(solution_str)
    if answer is None:
        return NO_ANSWER
    # no timeouts: math-verify's use signal.alarm, which only the main thread may set (verl scores in worker threads)
    gold = parse(str(ground_truth), parsing_timeout=None)
    return 1.0 if verify(gold, parse(answer, parsing_timeout=None), timeout_seconds=None) else 0.0
'''
NO_ANSWER = -0.5


@dataclass
class TeamInstall:
    """What the team's install into the CPU environment did, for the report."""

    python: Path
    fork_commit: str
    fork_version: str
    by_hash: list[str]
    by_version: list[str]
    replaced: dict[str, str]

    def notes(self) -> list[dict[str, str]]:
        notes = [
            {
                "package": f"verl=={self.fork_version} (the team's fork)",
                "why": f"verl's release sdist committed here with the team's commit {self.fork_commit[:12]}, built by "
                "`ascendkit team lock` and installed by the lock's hash",
            },
            {
                "package": f"{len(self.by_hash)} team packages",
                "why": f"locked for {LOCK_ARCH} against the stack's resolved lock (its x86_64 one is unresolved here); pure "
                f"wheels, installed by the lock's hashes: {', '.join(self.by_hash)}",
            },
        ]
        if self.by_version:
            notes.append(
                {
                    "package": f"{len(self.by_version)} team packages by version",
                    "why": f"their locked files are {LOCK_ARCH} wheels: this arch's wheel of the same version: "
                    + ", ".join(self.by_version),
                }
            )
        notes += [{"package": f"{name} (replace:)", "why": why} for name, why in sorted(self.replaced.items())]
        return notes


def _run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    done = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise AscendkitError(f"{' '.join(argv[:4])} ... failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-1500:]}")
    return done.stdout


def _files(client: IndexClient, name: str) -> tuple[DistFile, ...]:
    """What PyPI serves of ``name``; an index that cannot be reached or lacks it is said as the run's failure."""
    try:
        return client.project(PYPI, name).files
    except (IndexUnreachable, ProjectMissing) as exc:
        raise AscendkitError(f"PyPI: {name}: {exc or 'no such project'}") from None


def release_sdist(dist: str, version: str, work: Path) -> Path:
    """The release's sdist from PyPI, checked against the sha256 the index gives."""
    client = IndexClient()
    found = next((f for f in _files(client, dist) if f.kind == "sdist" and str(f.version) == version), None)
    if found is None or not found.sha256:
        raise AscendkitError(f"PyPI has no sdist of {dist} {version} with a sha256: the fork is made of the release's sdist")
    dest = work / found.filename
    if not dest.is_file() or hashlib.sha256(dest.read_bytes()).hexdigest() != found.sha256:
        download(client.session, found.url, dest, frozenset({found.sha256}))
    return dest


def make_fork(sdist: Path, work: Path) -> tuple[str, str]:
    """The team's fork as a git repository: the release as published, then the team's commit. Its URL and commit."""
    repo = work / "verl-fork"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/", 1)[0]
        archive.extractall(work / "verl-fork-unpacked", filter="data")
    shutil.rmtree(repo)
    shutil.move(str(work / "verl-fork-unpacked" / top), repo)
    shutil.rmtree(work / "verl-fork-unpacked")
    git = ["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"]
    _run([*git, "init", "--quiet"], repo, GIT_ENV)
    _run([*git, "add", "--all"], repo, GIT_ENV)
    _run([*git, "commit", "--quiet", "-m", f"{sdist.name} as released"], repo, GIT_ENV)
    (repo / FORK_MODULE).write_text(FORK_CODE, encoding="utf-8")
    _run([*git, "add", FORK_MODULE], repo, GIT_ENV)
    _run([*git, "commit", "--quiet", "-m", "acme: the final-answer reader the team's rewards share"], repo, GIT_ENV)
    return repo.resolve().as_uri(), _run(["git", "rev-parse", "HEAD"], repo, GIT_ENV).strip()


def make_team(work: Path, stack_id: str, sku_id: str, git_url: str, commit: str) -> Path:
    """The team's repository: its team file, its reward function."""
    root = work / "team"
    shutil.rmtree(root, ignore_errors=True)
    (root / "rewards").mkdir(parents=True)
    (root / "rewards" / "math.py").write_text(REWARD_CODE, encoding="utf-8")
    spec: dict[str, Any] = {
        "schema_version": 1,
        "name": TEAM,
        "base": {"stack": stack_id, "sku": sku_id},
        "packages": list(PACKAGES),
        "framework": {"git": git_url, "commit": commit, "replaces": "verl"},
        "files": [{"src": "rewards", "dest": "/opt/team/rewards"}],
        "env": {"TEAM_REWARD": "/opt/team/rewards/math.py"},
    }
    if REPLACE.get(stack_id):
        spec["replace"] = REPLACE[stack_id]
    (root / "ascendkit-team.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return root


def lock_team(team: Path, matrix: Path) -> Path:
    """``ascendkit team lock`` in the team's repository, as a team runs it."""
    _run([str(BIN / "ascendkit"), "team", "lock", "--arch", LOCK_ARCH, "--matrix", str(matrix), "--json"], team)
    return team / f"ascendkit-team-{LOCK_ARCH}.lock"


def _python_json(python: Path, program: str, *args: str) -> Any:
    return json.loads(_run([str(python), "-c", program, *args]).strip().splitlines()[-1])


def _pure_locked(client: IndexClient, package: LockedPackage) -> bool:
    """Whether the wheels the lock allows are pure (installable on any arch by the same hashes; uv takes a wheel before
    the sdist the lock allows too)."""
    hashes = {h.removeprefix("sha256:") for h in package.hashes}
    wheels = [f for f in _files(client, package.name) if f.sha256 in hashes and f.kind == "wheel"]
    return bool(wheels) and all(t.platform == "any" for f in wheels for t in f.tags)


def install_team(plan: CpuEnvPlan, team: Path, lock: Path, venv: Path, python: str) -> tuple[TeamInstall, list[str]]:
    """The team's lock and fork in a CPU environment of the stack of their own, as ``team build`` installs them (its
    packages with no dependencies of their own resolution, every hash held; the fork's wheel by the lock's hash); the
    problems the before/after comparison and the imports found."""
    shutil.rmtree(venv, ignore_errors=True)  # an earlier run's team packages would be read as the base's
    env_python = make_env(plan, venv, python)
    before = _python_json(env_python, DISTRIBUTIONS)
    locked = read_lock(lock)
    packages, forks = locked.layers.get(TEAM_LAYER, []), locked.layers.get(FORK_LAYER, [])
    if not packages or len(forks) != 1:
        raise AscendkitError(f"{lock.name}: not a lock of the team's packages ({TEAM_LAYER}) and its fork ({FORK_LAYER})")
    client = IndexClient()
    pure = [p for p in packages if _pure_locked(client, p)]
    rest = [p for p in packages if p not in pure]
    hashed = venv.with_name(venv.name + "-team.txt")
    hashed.write_text("".join(f"{p.key}=={p.version} " + " ".join(f"--hash={h}" for h in p.hashes) + "\n" for p in pure), encoding="utf-8")
    uv = [uv_binary(), "pip", "install", "--quiet", "--python", str(env_python), "--no-deps", "--index-url", PYPI]
    _run([*uv, "--require-hashes", "-r", str(hashed)])
    if rest:
        _run([*uv, *(f"{p.key}=={p.version}" for p in rest)])
    (wheel,) = (team / WHEELS_DIR).glob("*.whl")
    if f"sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}" not in forks[0].hashes:
        raise AscendkitError(f"{wheel.name}: not the wheel the lock's {FORK_LAYER} section names")
    _run([*uv, "--reinstall-package", "verl", str(wheel)])
    after = _python_json(env_python, DISTRIBUTIONS)
    spec = yaml.safe_load((team / "ascendkit-team.yaml").read_text(encoding="utf-8"))
    replaced = {str(canonicalize_name(k)): str(v) for k, v in (spec.get("replace") or {}).items()}
    free = {"verl", *replaced}
    problems = moved(before, after, free) + shared(before, after, free)
    team_dists = sorted({p.key for p in packages if p.key not in before} | {"verl"})
    imported = _python_json(env_python, IMPORTS, *team_dists)
    problems += [f"{module} does not import: {why}" for module, why in sorted(imported["failed"].items())]
    fork_files = after.get("verl", [None, None, None, []])[3]
    if not any(path.endswith(FORK_MODULE.split("verl/", 1)[1]) for path in fork_files):
        problems.append("the installed verl is not the fork: it has no " + FORK_MODULE)
    commit = str(spec["framework"]["commit"])
    _, version, *_ = parse_wheel_filename(wheel.name)
    install = TeamInstall(env_python, commit, str(version), sorted(p.key for p in pure), sorted(p.key for p in rest), replaced)
    return install, problems


def run_team(loaded: LoadedMatrix, stack_id: str, plan: CpuEnvPlan, work: Path, python: str, say: Any) -> CpuRun:
    """The worked example on ``stack_id``: fork, team repository, lock, install, then the GRPO job's CPU run."""
    stack = loaded.matrix.stacks[stack_id]
    if stack.framework != "verl":
        raise InputError(f"{stack_id}: the team example is a verl fork; {stack_id} runs {stack.framework}")
    work.mkdir(parents=True, exist_ok=True)
    sdist = release_sdist("verl", stack.framework_version, work)
    git_url, commit = make_fork(sdist, work)
    say(f"the team's fork: {sdist.name} and the team's commit {commit[:12]} at {git_url}")
    team = make_team(work, stack_id, stack.skus[0], git_url, commit)
    lock = lock_team(team, loaded.path.resolve())
    say(f"`ascendkit team lock --arch {LOCK_ARCH}`: {len(read_lock(lock).packages)} packages locked against the stack's lock")
    install, problems = install_team(plan, team, lock, work / f"{stack_id}-team-venv", python)
    say(f"installed: {len(install.by_hash)} by hash, {len(install.by_version)} by version, the fork by its hash")
    if problems:
        raise AscendkitError("the team's install moved the base or does not import:\n  " + "\n  ".join(problems))
    say("nothing of the base moved but what the team file names; the team's packages and the fork import")
    sku = loaded.matrix.skus[stack.skus[0]]
    reward_key = "custom_reward_function"
    if not older(stack.framework_version, loaded.matrix.compat.verl_legacy_reward_ignored):
        reward_key = "reward.custom_reward_function"
    reward = team / "rewards" / "math.py"
    job_work = work / f"{stack_id}-team-grpo"
    job_work.mkdir(parents=True, exist_ok=True)
    place = LocalPlace(install.python, job_work, description=f"CPU environment of {stack_id} with team {TEAM}'s lock and fork")
    image = ImageJob.of(stack_id, stack)
    run = run_cpu(
        place, job_work, image, "grpo", sku, JobFacts.of(loaded.matrix.compat),
        left_out=[*plan.left_out_report(), *install.notes()], progress=say,
        variation=Variation(overrides=(f"{reward_key}.path={reward}", f"{reward_key}.name=compute_score")),
    )  # fmt: skip
    run.stack = f"{stack_id} + team {TEAM}"
    run.version = f"{install.fork_version} (fork {install.fork_commit[:12]})"
    rewards = (run.step_result or {}).get("rewards") or []
    if run.step is not None and run.step.reached and NO_ANSWER not in rewards:
        detail = f"its rewards {rewards[:8]} hold no {NO_ANSWER}: the team's reward function did not score the step"
        run.step = Verdict(False, str(reward), "reward", detail)
    return run
