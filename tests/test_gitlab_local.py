"""The GitLab pipeline executed, not only validated: gitlab-ci-local (npm, pinned in tests/harness/services.py) runs
ci/gitlab/images.gitlab-ci.yml with the shell executor in a clone of this repository, against the test stack: the plan
job writes the child pipeline; then the child's build job for the test image builds and verifies it on the real
engine and pushes it, signed, to the local registry, which skopeo reads back.

gitlab-ci-local does not run `trigger:` jobs (its job list has no `ascendkit-images`): the child pipeline the plan job
wrote is run directly with `--file`, which is what GitLab's trigger does with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildkit.ci.gitlab import CHILD_FILE, GITLAB_FILE
from buildkit.imageref import split_ref
from tests.conftest import ROOT, TEST_MATRIX, DockerEnv
from tests.test_team import GOOD, team_repo

pytestmark = pytest.mark.docker

STACK, CHIP, OS = "teststack", "a3", "debian12"
PASSWORD = "gitlab pipeline test passphrase"


def _gitlab_ci_local() -> str:
    exe = os.environ.get("ASCENDKIT_GITLAB_CI_LOCAL")
    if not exe or not Path(exe).exists():
        if os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get("ASCENDKIT_REQUIRE_DOCKER") == "1":
            pytest.fail("ASCENDKIT_GITLAB_CI_LOCAL is not set: `make test` installs gitlab-ci-local")
        pytest.skip("ASCENDKIT_GITLAB_CI_LOCAL is not set: `make test` (tests/harness/services.py) installs gitlab-ci-local")
    return exe


def _project(tmp: Path) -> Path:
    """A clone of this repository that includes the pipeline, as a GitLab project would."""
    project = tmp / "project"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(project)], check=True)
    (project / ".gitlab-ci.yml").write_text(f"include:\n  - local: {GITLAB_FILE}\n", encoding="utf-8")
    git = ["git", "-C", str(project), "-c", "user.email=ci@example.com", "-c", "user.name=ci"]
    subprocess.run([*git, "remote", "set-url", "origin", "https://gitlab.example.com/ml/ascendkit.git"], check=True)
    subprocess.run([*git, "add", ".gitlab-ci.yml"], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "include the ascendkit pipeline"], check=True)
    return project


def _run(exe: str, project: Path, variables: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [exe, *(a for k, v in variables.items() for a in ("--variable", f"{k}={v}")), *args]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # python3: this interpreter
    return subprocess.run(argv, cwd=project, capture_output=True, text=True, check=False, timeout=1800, env=env)


def test_the_pipeline_runs_plans_builds_and_pushes_the_test_image(docker_env: DockerEnv, tmp_path: Path) -> None:
    exe = _gitlab_ci_local()
    project = _project(tmp_path)
    keys = tmp_path / "keys"
    env = {**docker_env.env, "COSIGN_PASSWORD": PASSWORD}
    subprocess.run([str(Path(sys.executable).with_name("ascendkit")), "keygen", "-o", str(keys)], env=env, check=True, capture_output=True)
    common = {"ASCENDKIT_MATRIX": "tests/fixtures/test_matrix.yaml", "ASCENDKIT_STACKS": STACK}
    pushed_commit = _run(exe, project, common, "--list")
    assert "ascendkit-plan" not in pushed_commit.stdout, "a push to the project builds nothing: the fleet is built when asked"
    common["CI_PIPELINE_SOURCE"] = "web"  # run from the web UI

    planned = _run(exe, project, common, "ascendkit-plan")
    assert planned.returncode == 0 and "PASS  ascendkit-plan" in planned.stdout, planned.stdout[-3000:] + planned.stderr[-2000:]
    child = project / ".gitlab-ci-local" / "artifacts" / "ascendkit-plan" / CHILD_FILE
    jobs = yaml.safe_load(child.read_text(encoding="utf-8"))
    build = f"build-{STACK}-{CHIP}-{OS}-x86_64"
    assert build in jobs and f"index-{STACK}-{CHIP}-{OS}" in jobs, sorted(jobs)
    shutil.copy2(child, project / CHILD_FILE)  # what GitLab's trigger runs: the plan job's artifact

    repo = f"gl-{uuid.uuid4().hex[:8]}"
    private = (keys / "cosign.key").read_text(encoding="utf-8")
    variables = {
        **common,
        "ASCENDKIT_PUSH": "true",
        "ASCENDKIT_REGISTRY": f"{docker_env.registry}/{repo}",
        # its own local repository: the session's other tests keep ascendkit/verl's tags for the image they built
        "ASCENDKIT_BUILD_ARGS": f"--base-image {docker_env.standin} --repo {repo}/verl",
        "REGISTRY_USERNAME": "ci",
        "REGISTRY_PASSWORD": "the local registry asks for none",
        "COSIGN_PRIVATE_KEY": private,
        "COSIGN_PASSWORD": PASSWORD,
        "DOCKER_HOST": docker_env.env.get("DOCKER_HOST", ""),
        "DOCKER_CONFIG": str(tmp_path / "docker-config"),  # docker login writes here, not to the machine's config
        "ASCENDKIT_CACHE": docker_env.env["ASCENDKIT_CACHE"],
        "ASCENDKIT_CACHE_REPO": f"{docker_env.registry}/{repo}/buildcache",  # BuildKit's registry cache, as a CI/CD variable
    }
    try:
        ran = _run(exe, project, variables, "--file", CHILD_FILE, build)
    finally:
        for image in docker_env.client.images(name=f"{repo}/verl"):  # the tags this test made, not left behind
            for tag in image.get("RepoTags") or []:
                docker_env.client.remove_image(tag, noprune=True)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0 and f"PASS  {build}" in ran.stdout, output[-5000:]
    assert private.splitlines()[1] not in output and PASSWORD not in output, "the key and its password never reach the log"
    kept = project / ".gitlab-ci-local" / "artifacts" / build / "manifests"
    (record,) = [p for p in kept.glob("*.json") if not p.name.endswith(".cdx.json")]  # the build manifest (beside its SBOM)
    recorded = json.loads(record.read_text(encoding="utf-8"))
    published = recorded["published"]
    assert recorded["builder"]["name"] == "buildkit"
    assert recorded["builder"]["cache"] == f"{docker_env.registry}/{repo}/buildcache:buildcache-{STACK}-{CHIP}-{OS}-x86_64"
    assert published["repository"] == f"{docker_env.registry}/{repo}/verl", "pushed to $ASCENDKIT_REGISTRY/<framework>"
    digest = published["digest"]
    inspected = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", f"docker://{docker_env.registry}/{repo}/verl@{digest}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert inspected.returncode == 0, inspected.stderr
    labels = json.loads(inspected.stdout)["Labels"]
    assert labels["io.ascendkit.stack"] == STACK and labels["io.ascendkit.chip"] == CHIP


def test_the_team_pipeline_installs_ascendkit_from_an_index_and_builds_the_team_image(
    docker_env: DockerEnv, built: dict[str, Any], ascendkit_wheel: Path, tmp_path: Path
) -> None:
    """`ascendkit team ci --gitlab` run by gitlab-ci-local in a team's own repository (no ascendkit checkout): its job
    installs this release by the name pip knows it by (the wheel served from a find-links directory, as from a PyPI
    mirror; its dependencies from the index), pulls the base by the digest the registry holds, checks the team file
    and its lock and builds the team image on the real engine."""
    exe = _gitlab_ci_local()
    pushed = built["pushed"][0]
    image = f"{split_ref(pushed['ref'])[0]}@{pushed['digest']}"  # by digest, in the repository it was pushed to
    name = f"acme/team-gl-{uuid.uuid4().hex[:8]}"
    project = tmp_path / "team"
    team = GOOD.replace("acme/verl-math", name).replace("  stack: teststack\n  sku: a2-box16\n", f"  image: {image}\n")
    team_repo(project, team)
    # the test stack's image names the test matrix's indexes: the team's repository carries that matrix, which
    # ascendkit reads from the working directory as it reads any user's own (the released one does not know them)
    shutil.copy2(TEST_MATRIX, project / "compat_matrix.yaml")
    docker_env.client.pull(image)  # the lock reads the base from the image, as the team's own machine has it
    cli = [str(Path(sys.executable).with_name("ascendkit")), "team"]
    for args in (["lock", "--arch", "x86_64"], ["ci", "--gitlab", "--arch", "x86_64"]):
        done = subprocess.run([*cli, *args], cwd=project, env=docker_env.env, capture_output=True, text=True, check=False, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    (project / ".gitlab-ci.yml").write_text("include:\n  - local: ci/gitlab/team-image.gitlab-ci.yml\n", encoding="utf-8")
    git = ["git", "-C", str(project), "-c", "user.email=ci@example.com", "-c", "user.name=ci"]
    subprocess.run(["git", "init", "--quiet", str(project)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "the team's image"], check=True)
    subprocess.run([*git, "remote", "add", "origin", "https://gitlab.example.com/acme/verl-math.git"], check=True)
    variables = {
        # where this release's wheel is, as a mirror would serve it (beside what the machine's pip already finds)
        "PIP_FIND_LINKS": f"{ascendkit_wheel.parent} {os.environ.get('PIP_FIND_LINKS', '')}".strip(),
        "DOCKER_HOST": docker_env.env.get("DOCKER_HOST", ""),
        "DOCKER_CONFIG": str(tmp_path / "docker-config"),
        "ASCENDKIT_CACHE": docker_env.env["ASCENDKIT_CACHE"],
    }
    try:
        ran = _run(exe, project, variables, "team-image")
    finally:
        for found in docker_env.client.images(name=name):
            for tag in found.get("RepoTags") or []:
                docker_env.client.remove_image(tag, noprune=True)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0 and "PASS  team-image" in ran.stdout, output[-5000:]
    assert 'pip install --quiet "ascendkit-verl==' in output, "this release, by its distribution's name"
    kept = project / ".gitlab-ci-local" / "artifacts" / "team-image" / "manifests"
    (record,) = [p for p in kept.glob("*.json") if not p.name.endswith(".cdx.json")]
    recorded = json.loads(record.read_text(encoding="utf-8"))
    assert recorded["passed"] and recorded["team"]["base"]["ref"].endswith(built["digest"])
    assert sorted(recorded["team"]["added"]) == ["pyfiglet", "tabulate"]
