"""The CI workflow that ships the fleet (.github/workflows/images.yml): one more rendering of the plan.

From :func:`buildkit.plan.plan_fleet` (what ``ascendkit plan`` lists): a build job per (stack, chip,
OS, arch) on a native runner of that arch, pushing by digest and handing its build manifest and
SBOM over as an artifact; an index job per (stack, chip, OS) that joins them with the registry
alone (``publish --index-only``); and a smoke job per SKU on a self-hosted Ascend runner, off
unless asked. The workflow is data dumped to YAML, so quoting and indentation are the dumper's.

Hardening (what zizmor and GitHub's guide ask): no permissions at the top, least per job (write
only where a job pushes); actions pinned by full commit SHA with the version beside it; inputs
reach scripts only through ``env:``, never as ``${{ }}`` inside ``run:``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from buildkit.framework import framework as plugin
from buildkit.image.overview import overview_path
from buildkit.matrix.load import LoadedMatrix
from buildkit.plan import ImagePlan, plan_fleet

WORKFLOW_FILE = ".github/workflows/images.yml"
ACTIONLINT_CONFIG = ".github/actionlint.yaml"  # tells actionlint the self-hosted runners' labels
# Third-party actions: (repository, commit, the release tag that commit is).
ACTIONS = {
    "checkout": ("actions/checkout", "3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
    "setup-python": ("actions/setup-python", "5fda3b95a4ea91299a34e894583c3862153e4b97", "v7.0.0"),
    "upload-artifact": ("actions/upload-artifact", "bbbca2ddaa5d8feaa63e36b76fdaad77386f024f", "v7.0.0"),
    "download-artifact": ("actions/download-artifact", "3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c", "v8.0.1"),
}
# The jobs that log in to the registry run in this deployment environment: its secrets are theirs
# alone, and maintainers can put protection rules (reviewers, branches) on publishing.
REGISTRY_ENVIRONMENT = "registry"
BUILD_TIMEOUT_MINUTES = 360  # a hosted runner's limit; vllm-ascend's kernels take most of it
HEADER = """\
# Generated from compat_matrix.yaml by `ascendkit render --all` — do not edit.
# Ships every image of the matrix: a build job per (stack, chip, OS, arch) on a native runner,
# pushed by digest with its SBOM; an index job per (stack, chip, OS) joining the arches in the
# registry; a smoke job per SKU on a self-hosted Ascend runner when asked.
# Repository settings it reads: vars.ASCENDKIT_REGISTRY (HOST/NAMESPACE: each framework's images go to
# <it>/verl and <it>/openrlhf), and in the `registry` environment secrets.REGISTRY_USERNAME /
# REGISTRY_PASSWORD (default: the GitHub token, for ghcr.io) and, for quay.io's description API,
# secrets.REGISTRY_API_TOKEN; vars.ASCENDKIT_SMOKE_MODEL (Qwen2.5-0.5B-Instruct's directory on the Ascend runners).
# After the indexes, each framework repository's description is set to its page in docs/repositories/
# where the registry keeps one (quay.io, Harbor, Docker Hub).
# Everything pushed is signed, with its provenance: the `registry` environment's secrets.COSIGN_PRIVATE_KEY
# (cosign.key from `ascendkit keygen`, its PEM) and secrets.COSIGN_PASSWORD reach ascendkit only as
# environment variables (--sign-key env://COSIGN_PRIVATE_KEY): never an argument, a file or a build layer.
"""
SIGNING_ENV = {"COSIGN_PRIVATE_KEY": "${{ secrets.COSIGN_PRIVATE_KEY }}", "COSIGN_PASSWORD": "${{ secrets.COSIGN_PASSWORD }}"}
SIGN = " --sign-key env://COSIGN_PRIVATE_KEY"


def job_id(*parts: str) -> str:
    """A job id GitHub accepts (letters, digits, - and _), from a target's names."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", "-".join(parts))


def _uses(action: str) -> str:
    repository, commit, _ = ACTIONS[action]
    return f"{repository}@{commit}"


def _setup(hosted: bool) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"uses": _uses("checkout"), "with": {"persist-credentials": False}}]
    if hosted:
        steps.append({"uses": _uses("setup-python"), "with": {"python-version": "${{ env.PYTHON_VERSION }}"}})
        steps.append({"name": "Install ascendkit", "run": "python -m pip install ."})
    else:  # a self-hosted NPU host keeps its own Python: a venv of its own, nothing installed system-wide
        steps.append(
            {
                "name": "Install ascendkit",
                "run": 'python3 -m venv .venv\n.venv/bin/python -m pip install .\necho "$PWD/.venv/bin" >> "$GITHUB_PATH"\n',
            }
        )
    return steps


def _login(condition: str | None) -> dict[str, Any]:
    step: dict[str, Any] = {
        "name": "Log in to the registry",
        "env": {
            "REGISTRY_USERNAME": "${{ secrets.REGISTRY_USERNAME || github.actor }}",
            "REGISTRY_PASSWORD": "${{ secrets.REGISTRY_PASSWORD || github.token }}",
        },
        "run": "printf '%s' \"$REGISTRY_PASSWORD\" \\\n"
        '  | docker login "${ASCENDKIT_REGISTRY%%/*}" --username "$REGISTRY_USERNAME" --password-stdin\n',
    }
    return {"if": condition, **step} if condition else step


def _stack_selected(stack_id: str) -> str:
    return f"inputs.stacks == 'all' || contains(format(',{{0}},', inputs.stacks), ',{stack_id},')"


def _build_job(plan: ImagePlan, runners: tuple[str, ...], group: str) -> dict[str, Any]:
    command = f"ascendkit build --hw {plan.chip_id} --stack {plan.stack_id} --os {plan.os_name} --arch {plan.arch} --quiet"
    return {
        "name": f"build {plan.stack_id} {plan.chip_id} {plan.os_name} {plan.arch}",
        "if": _stack_selected(plan.stack_id),
        "environment": REGISTRY_ENVIRONMENT,
        "runs-on": list(runners),
        "permissions": {"contents": "read", "packages": "write"},
        "timeout-minutes": BUILD_TIMEOUT_MINUTES,
        "steps": [
            *_setup(hosted=True),
            _login("inputs.push"),
            {"name": "Build and verify", "if": "${{ !inputs.push }}", "run": command + "\n"},
            {
                "name": "Build, verify, push by digest with the SBOM, signed with its provenance",
                "if": "inputs.push",
                "env": SIGNING_ENV,
                "run": command + f' --push --no-index --registry "$ASCENDKIT_REGISTRY/{plan.framework}"{SIGN}\n',
            },
            {
                "name": "Keep the build manifest and SBOM",
                "uses": _uses("upload-artifact"),
                "with": {"name": f"manifest-{group}-{plan.arch}", "path": "manifests/", "if-no-files-found": "error"},
            },
        ],
    }


def _index_job(group: str, first: ImagePlan, needs: list[str], runners: tuple[str, ...]) -> dict[str, Any]:
    return {
        "name": f"index {first.stack_id} {first.chip_id} {first.os_name}",
        "needs": needs,
        "if": "inputs.push",
        "environment": REGISTRY_ENVIRONMENT,
        "runs-on": list(runners),
        "permissions": {"contents": "read", "packages": "write"},
        "timeout-minutes": 30,
        "outputs": {"image": "${{ steps.index.outputs.image }}"},
        "steps": [
            *_setup(hosted=True),
            {
                "name": "Collect the arches' build manifests and SBOMs",
                "uses": _uses("download-artifact"),
                "with": {"pattern": f"manifest-{group}-*", "path": "manifests", "merge-multiple": True},
            },
            _login(None),
            {
                "name": "Check the members in the registry, attach their SBOMs, publish the signed multi-arch index",
                "id": "index",
                "env": SIGNING_ENV,
                "run": "ascendkit publish --index-only --manifest-dir manifests "
                f'--registry "$ASCENDKIT_REGISTRY/{first.framework}"{SIGN} --json > published.json\n'
                "printf 'image=%s\\n' \"$(jq -r '.[0].index[0].ref' published.json)\" >> \"$GITHUB_OUTPUT\"\n",
            },
        ],
    }


def _describe_job(framework: str, needs: list[str], runners: tuple[str, ...]) -> dict[str, Any]:
    """The framework repository's description set to its overview page, where the registry keeps one."""
    page = overview_path(framework)
    return {
        "name": f"describe {framework}",
        "needs": needs,
        # after every index job of the framework that ran (a stack left out skips its own), none failed
        "if": "${{ inputs.push && !cancelled() && !contains(needs.*.result, 'failure') }}",
        "environment": REGISTRY_ENVIRONMENT,
        "runs-on": list(runners),
        "permissions": {"contents": "read"},
        "timeout-minutes": 10,
        "steps": [
            *_setup(hosted=True),
            {
                "name": f"Set the repository's description to {page} (quay.io, Harbor, Docker Hub)",
                "env": {
                    "ASCENDKIT_REGISTRY_TOKEN": "${{ secrets.REGISTRY_API_TOKEN }}",
                    "ASCENDKIT_REGISTRY_USERNAME": "${{ secrets.REGISTRY_USERNAME }}",
                    "ASCENDKIT_REGISTRY_PASSWORD": "${{ secrets.REGISTRY_PASSWORD }}",
                },
                "run": f'ascendkit describe "$ASCENDKIT_REGISTRY/{framework}" --page {page} --if-supported\n',
            },
        ],
    }


def _smoke_step(sku_id: str, index_id: str, job: str, first: bool) -> dict[str, Any]:
    return {
        "name": f"{job.upper()} smoke test on the NPUs",
        **({} if first else {"if": "!cancelled()"}),  # runs after a failed one too: each has its own report
        "env": {"IMAGE": f"${{{{ needs.{index_id}.outputs.image }}}}"},
        "run": f'ascendkit smoke --hw {sku_id} --job {job} --image "$IMAGE" --model-path "$ASCENDKIT_SMOKE_MODEL" --out smoke-out/{job}\n',
    }


def _smoke_job(sku_id: str, index_id: str, runners: list[str], jobs: tuple[str, ...]) -> dict[str, Any]:
    """The image's smoke jobs (GRPO; verl's SFT too) one after the other on the SKU's NPUs; each keeps its report."""
    return {
        "name": f"smoke {sku_id} ({index_id.removeprefix('index-')})",
        "needs": [index_id],
        "if": "inputs.push && inputs.smoke",
        "environment": REGISTRY_ENVIRONMENT,
        "runs-on": runners,
        "permissions": {"contents": "read"},
        "timeout-minutes": 120,
        "steps": [
            *_setup(hosted=False),
            _login(None),
            *(_smoke_step(sku_id, index_id, job, i == 0) for i, job in enumerate(jobs)),
            {
                "name": "Keep the smoke report",
                "if": "always()",
                "uses": _uses("upload-artifact"),
                "with": {"name": f"smoke-{index_id.removeprefix('index-')}-{sku_id}", "path": "smoke-out/", "if-no-files-found": "warn"},
            },
        ],
    }


def smoke_runners(loaded: LoadedMatrix, sku_id: str) -> list[str]:
    configured = loaded.matrix.ci.smoke_runners.get(sku_id)
    if configured:
        return list(configured)
    arch = "ARM64" if loaded.matrix.skus[sku_id].host_arch == "aarch64" else "X64"
    return ["self-hosted", "linux", arch, f"ascend-{sku_id}"]


def workflow_data(loaded: LoadedMatrix) -> dict[str, Any]:
    ci = loaded.matrix.ci
    jobs: dict[str, Any] = {}
    groups: dict[str, list[ImagePlan]] = {}
    for plan in plan_fleet(loaded):
        groups.setdefault(job_id(plan.stack_id, plan.chip_id, plan.os_name), []).append(plan)
    for group, plans in groups.items():
        for plan in plans:
            jobs[f"build-{group}-{plan.arch}"] = _build_job(plan, ci.build_runners[plan.arch], group)
    fallback_runner = ci.build_runners.get("x86_64") or next(iter(ci.build_runners.values()))
    for group, plans in groups.items():
        index_id = f"index-{group}"
        jobs[index_id] = _index_job(group, plans[0], [f"build-{group}-{p.arch}" for p in plans], fallback_runner)
        for sku_id in plans[0].skus:
            smoke = plugin(plans[0].framework).jobs
            jobs[job_id("smoke", group, sku_id)] = _smoke_job(sku_id, index_id, smoke_runners(loaded, sku_id), smoke)
    for framework in sorted({plans[0].framework for plans in groups.values()}):
        needs = [f"index-{group}" for group, plans in groups.items() if plans[0].framework == framework]
        jobs[f"describe-{framework}"] = _describe_job(framework, needs, fallback_runner)
    return {
        "name": "images",
        "on": {
            "workflow_dispatch": {
                "inputs": {
                    "stacks": {
                        "description": "Stacks to build, comma separated without spaces (e.g. cann8.3,cann8.5), or all",
                        "type": "string",
                        "default": "all",
                        "required": True,
                    },
                    "push": {
                        "description": "Push the images by digest with their SBOMs, then the multi-arch indexes",
                        "type": "boolean",
                        "default": False,
                    },
                    "smoke": {
                        "description": "After the push, run each image's smoke jobs (GRPO; verl's SFT) on the self-hosted Ascend runners",
                        "type": "boolean",
                        "default": False,
                    },
                }
            }
        },
        "permissions": {},
        "concurrency": {"group": "images-${{ github.ref }}", "cancel-in-progress": False},
        "env": {
            "ASCENDKIT_REGISTRY": "${{ vars.ASCENDKIT_REGISTRY }}",
            "ASCENDKIT_SMOKE_MODEL": "${{ vars.ASCENDKIT_SMOKE_MODEL }}",
            "PYTHON_VERSION": ci.python,
        },
        "jobs": jobs,
    }


class _Dumper(yaml.SafeDumper):
    """Block style for scripts; ``on`` unquoted (YAML 1.1 would read it as a boolean, GitHub reads a key)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def render_workflow(loaded: LoadedMatrix) -> str:
    text = yaml.dump(workflow_data(loaded), Dumper=_Dumper, sort_keys=False, width=200, allow_unicode=True)
    text = text.replace("\n'on':\n", "\non:\n", 1)
    for repository, commit, version in ACTIONS.values():
        text = text.replace(f"uses: {repository}@{commit}\n", f"uses: {repository}@{commit}  # {version}\n")
    return HEADER + text


def render_actionlint_config(loaded: LoadedMatrix) -> str:
    """actionlint's config: every label of a self-hosted runner the workflow names (the rest it knows)."""
    hosted = {label for labels in loaded.matrix.ci.build_runners.values() for label in labels}
    labels = sorted({label for sku_id in loaded.matrix.skus for label in smoke_runners(loaded, sku_id)} | hosted)
    body = yaml.dump({"self-hosted-runner": {"labels": labels}}, Dumper=_Dumper, sort_keys=False)
    return "# Generated from compat_matrix.yaml by `ascendkit render --all` — do not edit.\n" + body
