"""The third-party scanner's gate (tests/harness/scan.py, run by `make lint`): what it skips is reasoned,
and a defect it exists to catch fails it. checkov runs for real (from .venv-checkov)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
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


@pytest.fixture(scope="module")
def checkov() -> Path:
    if not CHECKOV.is_file():
        pytest.fail(f"{CHECKOV} is missing: `make lint` (or `make unit`) installs checkov into .venv-checkov")
    return CHECKOV


def test_a_container_without_its_security_context_fails_the_scan(checkov: Path, tmp_path: Path) -> None:
    write_manifests(tmp_path / "all")
    pod = next(yaml.safe_load_all((tmp_path / "all" / "rayjob-pods.yaml").read_text()))
    clean = tmp_path / "clean-pod.yaml"
    clean.write_text(yaml.safe_dump(pod))
    proc = scan(clean)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    planted = copy.deepcopy(pod)
    del planted["spec"]["containers"][0]["securityContext"]  # the defect: one container as the image leaves it
    bad = tmp_path / "planted-pod.yaml"
    bad.write_text(yaml.safe_dump(planted))
    proc = scan(bad)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = set(re.findall(r"FAILED (CKV\w+)", proc.stdout))
    # no escalation, no NET_RAW, capabilities dropped, a container security context, a read-only root
    assert {"CKV_K8S_20", "CKV_K8S_28", "CKV_K8S_37", "CKV_K8S_30", "CKV_K8S_22"} <= failed, proc.stdout
    assert "planted-pod.yaml" in proc.stdout and "checkov: " in proc.stdout


def test_host_network_is_skipped_where_asked_for_and_only_there(checkov: Path, tmp_path: Path) -> None:
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
    proc = scan(tmp_path / "all" / "hostnet-job.yaml", tmp_path / "all" / "rayjob-pods.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pod = next(yaml.safe_load_all((tmp_path / "all" / "rayjob-pods.yaml").read_text()))
    assert pod["spec"]["hostNetwork"] is True
    del pod["metadata"]["annotations"]["checkov.io/skip1"]  # the defect: the host's network, nobody's reason
    bad = tmp_path / "hostnet-pod.yaml"
    bad.write_text(yaml.safe_dump(pod))
    proc = scan(bad)
    assert proc.returncode == 1 and "FAILED CKV_K8S_19" in proc.stdout, proc.stdout + proc.stderr
    unskipped = copy.deepcopy(job)
    del unskipped["metadata"]["annotations"]
    (tmp_path / "hostnet-job-bare.yaml").write_text(yaml.safe_dump(unskipped))
    proc = scan(tmp_path / "hostnet-job-bare.yaml")
    assert proc.returncode == 1 and "FAILED CKV_K8S_19" in proc.stdout, proc.stdout + proc.stderr


def test_a_dockerfile_that_runs_as_root_fails_the_scan(checkov: Path, tmp_path: Path) -> None:
    text = (ROOT / "Dockerfile.a3").read_text()
    root = tmp_path / "Dockerfile.root"
    root.write_text(re.sub(r"(?m)^USER .*\n", "", text))
    proc = scan(root)
    assert proc.returncode == 1 and "FAILED CKV_DOCKER_3" in proc.stdout, proc.stdout + proc.stderr
