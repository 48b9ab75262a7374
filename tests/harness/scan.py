"""A third-party scanner over what ascendkit ships: checkov over the rendered Dockerfiles, the CI
workflow and every Kubernetes kind `k8s render` makes (part of `make lint`).

checkov cannot look inside custom resources, so the pods of the RayJob and the Volcano Job would go
unchecked: every kind's pod templates are also written out as plain v1 Pods. Every check left
failing is skipped in `.checkov.yaml` with its reason; anything else fails lint. Prints one line of
figures per framework and, on a failure, each failed check with its resource.

    python -m tests.harness.scan [--checkov PATH] [--keep DIR] [PATHS...]

PATHS replaces what is scanned (tests plant a defect this way); --keep leaves the written
manifests in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from buildkit.k8s.policy import POLICY_KINDS, render_policy
from buildkit.k8s.render import as_documents, dump, render
from buildkit.k8s.request import K8sRequest
from buildkit.k8s.validate import pod_templates
from buildkit.matrix.load import load_matrix
from buildkit.run.job import ImageJob, JobFacts
from buildkit.trust.keys import Signer

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".checkov.yaml"
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
WORKFLOW = ROOT / ".github" / "workflows" / "images.yml"
DIGEST = "sha256:" + "0123456789abcdef" * 4
NAMESPACE = "rl"
# Every kind and job `k8s render` makes, on the SKU its stack serves: (name, SKU, stack, request options).
KINDS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("job", "a3", "cann8.3", {}),
    ("hostnet-job", "a3", "cann8.3", {"host_network": True}),  # a batch/v1 Job on the host's network: its skip annotation
    ("sft-job", "a3", "cann8.3", {"job": "sft"}),
    ("train-job", "a3", "cann8.3", {"job": "train", "command": ("python3", "-m", "verl.trainer.main_ppo")}),
    ("job-volcano", "a3", "cann8.3", {"scheduler": "volcano", "queue": "rl"}),
    ("rayjob", "a3", "cann8.3", {"nodes": 2}),
    ("rayjob-volcano", "a3", "cann8.3", {"nodes": 2, "scheduler": "volcano"}),
    ("vcjob", "a3", "cann8.3", {"nodes": 3, "scheduler": "volcano", "kuberay": False}),
    ("a5-rayjob", "950-superpod", "cann9.1", {"nodes": 2}),  # huawei.com/npu, the UB topology files from the hosts
    ("sglang-rayjob", "a3", "sglang-cann8.5", {"nodes": 2}),
    ("openrlhf-job", "a2-box16", "openrlhf-cann8.1", {}),
    ("openrlhf-rayjob", "a2-box16", "openrlhf-cann8.1", {"nodes": 2}),
    ("openrlhf-vcjob", "a2-box16", "openrlhf-cann8.1", {"nodes": 2, "scheduler": "volcano", "kuberay": False}),
    ("preflight", "a3", "cann8.3", {"job": "preflight"}),
    ("preflight-volcano", "a2-box16", "cann8.3", {"job": "preflight", "scheduler": "volcano"}),
    ("prepull", "a3", "cann8.3", {"job": "prepull"}),
    ("prepull-openkruise", "a3", "cann8.3", {"job": "prepull", "puller": "openkruise", "pull_secret": "harbor-cred"}),
)


def pods_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template a workload carries: a batch/v1 Job's or the preflight DaemonSet's, or those
    `k8s validate` finds in a RayJob or a Volcano Job (present ones: the scan reads what is rendered)."""
    if doc["apiVersion"] in ("batch/v1", "apps/v1"):
        return [doc["spec"]["template"]]
    if doc["kind"] == "ConfigMap":
        return []
    return [template for _, template in pod_templates(doc) if isinstance(template, dict)]


def as_pod(workload: str, index: int, template: dict[str, Any]) -> dict[str, Any]:
    """The template as a plain Pod, named for its workload and role (the component label npu_pod gives it)."""
    role = template.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component", "pod")
    metadata = {**template.get("metadata", {}), "name": f"{workload}-{index}-{role}", "namespace": NAMESPACE}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def write_manifests(directory: Path) -> list[Path]:
    """Every kind as rendered, and each of its pods as a plain Pod."""
    loaded = load_matrix(ROOT / "compat_matrix.yaml")
    facts = JobFacts.of(loaded.matrix.compat)
    written = []
    directory.mkdir(parents=True, exist_ok=True)
    for name, sku_id, stack_id, options in KINDS:
        stack = loaded.matrix.stacks[stack_id]
        image = f"127.0.0.1:5000/ascendkit/{stack.framework}@{DIGEST}"
        job = ImageJob.of(stack_id, stack)
        request = K8sRequest(
            sku_id,
            loaded.matrix.skus[sku_id],
            image,
            image_job=job,
            facts=facts,
            namespace=NAMESPACE,
            user=loaded.matrix.image_user,
            **options,
        )
        text = render(request).text
        path = directory / f"{name}.yaml"
        path.write_text(text)
        written.append(path)
        templates = [template for doc in as_documents(text) for template in pods_of(doc)]
        pods = [as_pod(name, index, template) for index, template in enumerate(templates)]
        pod_path = directory / f"{name}-pods.yaml"
        pod_path.write_text(yaml.safe_dump_all(pods, sort_keys=False))
        written.append(pod_path)
    public = Signer(ec.generate_private_key(ec.SECP256R1()), "scan").public.pem().decode()
    for kind in POLICY_KINDS:  # the admission policies `k8s render --policy` makes (no pods in them)
        path = directory / f"policy-{kind}.yaml"
        path.write_text(dump(render_policy(kind, f"127.0.0.1:5000/ascendkit/verl@{DIGEST}", public), []))
        written.append(path)
    return written


def run_checkov(checkov: Path, framework: str, paths: list[Path]) -> dict[str, Any]:
    """checkov's JSON report for ``paths`` in one framework, offline, with the skips of .checkov.yaml."""
    argv = [str(checkov), "--skip-download", "--config-file", str(CONFIG), "--framework", framework, "--output", "json"]
    for path in paths:  # a directory is scanned whole (skip-path applies to what is found in it)
        argv += ["--directory" if path.is_dir() else "--file", str(path)]
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, cwd=ROOT)
    try:
        data = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except ValueError:
        sys.exit(f"checkov printed no JSON (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    reports = data if isinstance(data, list) else [data]
    merged: dict[str, list[dict[str, Any]]] = {"passed_checks": [], "failed_checks": [], "skipped_checks": []}
    for report in reports:
        for key in merged:
            merged[key] += (report.get("results") or {}).get(key, [])
    if proc.returncode not in (0, 1):
        sys.exit(f"checkov failed to run (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return merged


def framework_of(path: Path) -> str:
    if path.is_dir():
        return "kubernetes"
    if path.suffix in (".yml", ".yaml") and ".github" in path.parts:
        return "github_actions"
    if path.name.startswith("Dockerfile"):
        return "dockerfile"
    return "kubernetes"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.scan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkov", type=Path, default=CHECKOV)
    parser.add_argument("--keep", type=Path, help="write the manifests here (kept) instead of a temporary directory")
    parser.add_argument("paths", nargs="*", type=Path, help="scan these instead of everything ascendkit ships")
    args = parser.parse_args(argv)
    if not args.checkov.is_file():
        sys.exit(f"{args.checkov}: no checkov there (make lint installs it into .venv-checkov)")
    with tempfile.TemporaryDirectory(prefix="ascendkit-scan-") as tmp:
        directory = args.keep or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        if args.paths:
            paths = list(args.paths)
        else:
            dockerfiles = [ROOT / "Dockerfile.a2", ROOT / "Dockerfile.a3", *sorted((ROOT / "dockerfiles").glob("*/Dockerfile.*"))]
            write_manifests(directory)
            paths = [*dockerfiles, WORKFLOW, directory]
        by_framework: dict[str, list[Path]] = {}
        for path in paths:
            by_framework.setdefault(framework_of(path), []).append(path)
        failed = 0
        for framework, files in sorted(by_framework.items()):
            results = run_checkov(args.checkov, framework, files)
            counts = {k: len(results[f"{k}_checks"]) for k in ("passed", "failed", "skipped")}
            scanned = len({c.get("file_path") for k in ("passed", "failed", "skipped") for c in results[f"{k}_checks"]})
            print(
                f"checkov {framework}: {scanned} files, {counts['passed']} passed, {counts['failed']} failed, "
                f"{counts['skipped']} suppressed inline"
            )
            for check in results["failed_checks"]:
                where = Path(check.get("file_path", "")).name or check.get("repo_file_path", "")
                print(f"  FAILED {check['check_id']} {check.get('check_name', '')}: {where} {check.get('resource', '')}")
            failed += counts["failed"]
    config = yaml.safe_load(CONFIG.read_text())
    print(f"skipped with their reasons in {CONFIG.name}: {', '.join(config['skip-check'])}; paths {', '.join(config['skip-path'])}")
    if failed:
        print(f"checkov: {failed} failed checks; fix them, or skip one in {CONFIG.name} with its reason")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
