"""The third-party scanner's gate (tests/harness/scan.py, run by `make lint`): what it skips is reasoned,
and a defect it exists to catch fails it. checkov runs for real (from .venv-checkov)."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from buildkit.k8s.policy import POLICY_KINDS
from tests.harness.scan import CHECKOV, CONFIG, KINDS, ROOT, pods_of, write_manifests


def test_every_skip_in_the_config_has_its_reason() -> None:
    lines = CONFIG.read_text().splitlines()
    config = yaml.safe_load(CONFIG.read_text())
    assert set(config) == {"skip-check", "skip-path"}
    for key in config:
        for entry in config[key]:
            (index,) = [i for i, line in enumerate(lines) if re.fullmatch(rf"\s*- {re.escape(entry)}", line)]
            above = index - 1
            while lines[above].strip().startswith("- "):  # checks sharing one reason
                above -= 1
            assert lines[above].strip().startswith("#") and len(lines[above].strip()) > 20, f"{entry}: no reason above it"


def test_the_scan_covers_every_kind_and_every_pod(tmp_path: Path) -> None:
    written = write_manifests(tmp_path)
    kinds = set()
    for path in written:
        for doc in yaml.safe_load_all(path.read_text()):
            kinds.add((doc["apiVersion"], doc["kind"]))
            if doc["kind"] == "Pod":
                assert doc["metadata"]["namespace"] == "rl" and doc["spec"]["containers"]
    assert {("batch/v1", "Job"), ("ray.io/v1", "RayJob"), ("batch.volcano.sh/v1alpha1", "Job"), ("v1", "Pod"), ("v1", "ConfigMap")} <= kinds
    assert ("apps.kruise.io/v1alpha1", "ImagePullJob") in kinds, "the OpenKruise pre-pull too"
    pods = [doc for path in written if path.name.endswith("-pods.yaml") for doc in yaml.safe_load_all(path.read_text())]
    workloads = [
        d for p in written if not p.name.endswith("-pods.yaml") for d in yaml.safe_load_all(p.read_text()) if d["kind"] != "ConfigMap"
    ]
    assert len(pods) == sum(len(pods_of(d)) for d in workloads) and len(workloads) == len(KINDS) + len(POLICY_KINDS)
    assert {("kyverno.io/v1", "ClusterPolicy"), ("policy.sigstore.dev/v1beta1", "ClusterImagePolicy")} <= kinds, (
        "the admission policies too"
    )


def scan(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.harness.scan", "--checkov", str(CHECKOV), *map(str, paths)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip


@dataclass(frozen=True)
class Scanned:
    """One run of the gate over every planted file (checkov starts in seconds: once per session, not once per file)."""

    proc: subprocess.CompletedProcess[str]
    files: dict[str, Path]

    def failed(self, name: str) -> set[str]:
        """The checks that failed in file ``name``, as the gate prints them."""
        return set(re.findall(rf"FAILED (CKV\w+) [^\n]*: {re.escape(name)} ", self.proc.stdout))


def _plant(directory: Path) -> dict[str, Path]:
    """Each file a test below asks about: as shipped, and with one defect planted each."""
    write_manifests(directory / "all")
    files: dict[str, Path] = {}

    def put(name: str, text: str) -> None:
        files[name] = directory / name
        files[name].write_text(text)

    pod = next(yaml.safe_load_all((directory / "all" / "rayjob-pods.yaml").read_text()))
    put("clean-pod.yaml", yaml.safe_dump(pod))
    planted = copy.deepcopy(pod)
    del planted["spec"]["containers"][0]["securityContext"]  # the defect: one container as the image leaves it
    put("planted-pod.yaml", yaml.safe_dump(planted))
    put("hostnet-job.yaml", (directory / "all" / "hostnet-job.yaml").read_text())
    put("rayjob-pods.yaml", (directory / "all" / "rayjob-pods.yaml").read_text())
    bare_pod = copy.deepcopy(pod)
    del bare_pod["metadata"]["annotations"]["checkov.io/skip1"]  # the defect: the host's network, nobody's reason
    put("hostnet-pod.yaml", yaml.safe_dump(bare_pod))
    (job,) = [d for d in yaml.safe_load_all(files["hostnet-job.yaml"].read_text()) if d["kind"] == "Job"]
    del job["metadata"]["annotations"]
    put("hostnet-job-bare.yaml", yaml.safe_dump(job))
    put("Dockerfile.root", re.sub(r"(?m)^USER .*\n", "", (ROOT / "Dockerfile.a3").read_text()))
    return files


@pytest.fixture(scope="session")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> Scanned:
    """The scan, made by whichever xdist worker of this session asks first (under a lock), read by the others."""
    if not CHECKOV.is_file():
        pytest.fail(f"{CHECKOV} is missing: `make lint` (or `make unit`) installs checkov into .venv-checkov")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's, whichever worker this is
    with (shared / "checkov-scan.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / "checkov-scan.json"
        if not done.is_file():
            files = _plant(shared / "checkov-scan")
            proc = scan(*files.values())
            kept = {"code": proc.returncode, "out": proc.stdout, "err": proc.stderr, "files": {k: str(v) for k, v in files.items()}}
            done.write_text(json.dumps(kept))
        data = json.loads(done.read_text())
    proc = subprocess.CompletedProcess(["scan"], data["code"], data["out"], data["err"])
    assert proc.returncode == 1 and "checkov: " in proc.stdout, "planted defects fail the gate\n" + proc.stdout + proc.stderr
    return Scanned(proc, {k: Path(v) for k, v in data["files"].items()})


def test_a_container_without_its_security_context_fails_the_scan(scanned: Scanned) -> None:
    assert scanned.failed("clean-pod.yaml") == set(), scanned.proc.stdout
    assert yaml.safe_load(scanned.files["clean-pod.yaml"].read_text())["spec"]["containers"][0]["securityContext"]
    # no escalation, no NET_RAW, capabilities dropped, a container security context, a read-only root
    failed = scanned.failed("planted-pod.yaml")
    assert {"CKV_K8S_20", "CKV_K8S_28", "CKV_K8S_37", "CKV_K8S_30", "CKV_K8S_22"} <= failed, scanned.proc.stdout


def test_host_network_is_skipped_where_asked_for_and_only_there(scanned: Scanned, tmp_path: Path) -> None:
    """CKV_K8S_19 is not skipped for the whole scan: a workload on the host's network carries the skip
    as an annotation with its reason, and a pod that takes the host's network without it fails."""
    assert "CKV_K8S_19" not in yaml.safe_load(CONFIG.read_text())["skip-check"]
    write_manifests(tmp_path / "all")
    (job,) = [d for d in yaml.safe_load_all((tmp_path / "all" / "hostnet-job.yaml").read_text()) if d["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["hostNetwork"] is True
    reason = job["metadata"]["annotations"]["checkov.io/skip1"]
    assert reason.startswith("CKV_K8S_19=") and reason.count("=") == 1 and len(reason) > 40
    (one_node,) = [d for d in yaml.safe_load_all((tmp_path / "all" / "job.yaml").read_text()) if d["kind"] == "Job"]
    assert "annotations" not in one_node["metadata"] and "hostNetwork" not in one_node["spec"]["template"]["spec"]
    assert scanned.failed("hostnet-job.yaml") == set() == scanned.failed("rayjob-pods.yaml"), scanned.proc.stdout
    pod = next(yaml.safe_load_all((tmp_path / "all" / "rayjob-pods.yaml").read_text()))
    assert pod["spec"]["hostNetwork"] is True and "checkov.io/skip1" in pod["metadata"]["annotations"]
    assert "CKV_K8S_19" in scanned.failed("hostnet-pod.yaml"), scanned.proc.stdout
    assert "CKV_K8S_19" in scanned.failed("hostnet-job-bare.yaml"), scanned.proc.stdout


def test_a_dockerfile_that_runs_as_root_fails_the_scan(scanned: Scanned) -> None:
    assert not re.search(r"(?m)^USER ", scanned.files["Dockerfile.root"].read_text()), "the defect: no USER line, so root"
    assert "CKV_DOCKER_3" in scanned.failed("Dockerfile.root"), scanned.proc.stdout


def test_the_gate_names_each_failing_file_so_one_scan_serves_every_test(tmp_path: Path) -> None:
    """What Scanned.failed reads: the gate's line for a failed check ends with the file's name, then its resource."""
    line = "  FAILED CKV_K8S_20 Containers should not run with allowPrivilegeEscalation: planted-pod.yaml Pod.rl.x\n"
    proc = subprocess.CompletedProcess(["scan"], 1, line + line.replace("planted-pod", "other"), "")
    assert Scanned(proc, {}).failed("planted-pod.yaml") == {"CKV_K8S_20"}
    assert Scanned(proc, {}).failed("pod.yaml") == set(), "a file's name, not its end"
