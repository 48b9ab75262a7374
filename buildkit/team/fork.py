"""The team's framework fork: fetched from git at its full commit, built once to a pure wheel, locked by the wheel's
hash. The image installs that wheel, never the git URL (a hash-locked install refuses a git requirement)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from buildkit.errors import AscendkitError, Unavailable
from buildkit.lock.resolve import uv_binary
from buildkit.plan.layers import SOURCE_DATE_EPOCH
from buildkit.team.spec import LoadedTeam, TeamFramework

WHEELS_DIR = ".ascendkit/wheels"  # in the team's repository, beside its lock
GIT_TIMEOUT_S = 600


@dataclass(frozen=True)
class ForkWheel:
    path: Path
    dist: str  # canonical
    version: str
    requires: tuple[str, ...]
    sha256: str

    @property
    def pin(self) -> str:
        return f"{self.dist}=={self.version}"


def _git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)


def checkout(framework: TeamFramework, dest: Path) -> Path:
    """The fork's tree at its commit; the clone must reach it (exit 4 when the host cannot be reached)."""
    cloned = _git("clone", "--quiet", "--no-checkout", framework.git, str(dest))
    if cloned.returncode != 0:
        raise Unavailable(f"framework.git {framework.git}: cannot clone: {cloned.stderr.strip().splitlines()[-1:]}")
    switched = _git("-c", "advice.detachedHead=false", "checkout", "--quiet", framework.commit, cwd=dest)
    if switched.returncode != 0:
        raise AscendkitError(f"framework.commit {framework.commit} is not in {framework.git}: {switched.stderr.strip()}")
    return dest / framework.subdirectory if framework.subdirectory else dest


def read_wheel(path: Path) -> ForkWheel:
    name, version, _, tags = parse_wheel_filename(path.name)
    if not all(tag.abi == "none" and tag.platform == "any" for tag in tags):
        raise AscendkitError(f"{path.name}: the fork builds a platform wheel; only pure-Python forks are built here")
    with zipfile.ZipFile(path) as archive:
        meta_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(meta_name).decode("utf-8"))
    requires = tuple(metadata.get_all("Requires-Dist") or ())
    return ForkWheel(path, canonicalize_name(name), str(version), requires, hashlib.sha256(path.read_bytes()).hexdigest())


def build_fork(team: LoadedTeam, index_url: str, constraints: list[str]) -> ForkWheel:
    """Build the fork at its commit to a wheel in the team's ``.ascendkit/wheels/`` (its build held to the base's pins,
    its file times to the epoch), replacing any wheel of an earlier lock."""
    framework = team.spec.framework
    assert framework is not None
    wheels = team.root / WHEELS_DIR
    with tempfile.TemporaryDirectory(prefix="ascendkit-fork-") as tmp:
        work = Path(tmp)
        source = checkout(framework, work / "src")
        (work / "build-constraints.txt").write_text("".join(f"{c}\n" for c in constraints), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        env.update(UV_INDEX_URL=index_url, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH), PYTHONHASHSEED="0")
        command = [
            uv_binary(), "build", "--wheel", "--no-config", "--out-dir", str(work / "dist"),
            "--build-constraint", str(work / "build-constraints.txt"), str(source),
        ]  # fmt: skip
        built = subprocess.run(command, env=env, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
        if built.returncode != 0:
            raise AscendkitError(f"the fork at {framework.commit[:12]} did not build to a wheel:\n{built.stderr.strip()[-2000:]}")
        (wheel,) = (work / "dist").glob("*.whl")
        read_wheel(wheel)  # a platform wheel is refused before it is kept
        wheels.mkdir(parents=True, exist_ok=True)
        for old in wheels.glob("*.whl"):
            old.unlink()
        kept = wheels / wheel.name
        kept.write_bytes(wheel.read_bytes())
    return read_wheel(kept)
