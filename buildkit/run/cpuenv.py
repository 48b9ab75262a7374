"""A stack's CPU environment: the Python packages of its image that can be had on a machine without
NPUs or Ascend's index, installed into a virtual environment for a CPU run (``make cpu-run``, CI).

The versions are the image's: from the stack's resolved lock (either arch: the pins are the same),
or, where no lock of the stack is resolved (Ascend's index unreachable), resolved here by uv from the
stack's own pins, constraints and overrides and its source builds' requirement files, for CPython
3.11 on this machine's arch. What cannot be had is left out, each with the reason and where it could
matter before the boundary, and said in the report. torch is the one substitution: the stack's
CPU build lives on download.pytorch.org; the run uses a CPU build given as a wheel file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from buildkit.errors import InputError, Unavailable
from buildkit.lock.inputs import LockTarget, canon, lock_inputs
from buildkit.lock.lockfile import read_lock
from buildkit.lock.resolve import uv_binary
from buildkit.matrix.load import LoadedMatrix

PYTHON = "3.11"
# What no machine without Ascend's index and CANN can install, and why it does not stop a CPU run
# before the boundary (or where it could).
LEFT_OUT = {
    "torch-npu": "needs CANN's runtime and the NPU driver to load; verl 0.8+ picks the npu device when it imports, so a CPU run "
    "takes verl's CUDA/CPU path where the image would take the NPU one (device names, Ray's NPU resource)",
    "triton-ascend": "published on Ascend's index and compiled against CANN's bishengir; only the NPU kernels use it, after the boundary",
    "vllm": "the image builds it from source for Ascend (VLLM_TARGET_DEVICE=empty); the rollout worker imports it when it starts, "
    "after the boundary; its pure-Python requirements are installed",
    "vllm-ascend": "built against CANN; the rollout worker imports it after the boundary",
    "sglang": "the image builds its NPU project from source; the rollout worker imports it after the boundary",
    "torchvision": "built for the stack's torch, which is replaced (see torch)",
    "torchaudio": "built for the stack's torch, which is replaced (see torch)",
    "triton": "mainline triton (a dependency of xgrammar on x86_64) is kept out of the images as well: it shadows triton-ascend",
    "deep-ep": "sgl-kernel-npu's release archive (GitHub), built for CANN",
    "sgl-kernel-npu": "sgl-kernel-npu's release archive (GitHub), built for CANN",
    "torch-memory-saver": "sgl-kernel-npu's release archive (GitHub), built for CANN",
    "uv": "the images' installer, not used by a CPU run",
}
# Where a framework's entry point imports a left-out package before its boundary, the package is built here the way
# the image builds it, or replaced by a named stand-in. OpenRLHF's Ascend fork imports vllm (vllm.inputs) when its
# Ray launcher module loads: vllm is built from its sdist with no device, as the images build it (vllm-ascend, which
# supplies the device, stays out). It picks its NPU path by whether torch_npu can be found: smoke_tests/cpu_standins.
BUILT_HERE: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {"openrlhf": {"vllm": (("VLLM_TARGET_DEVICE", "empty"),)}}
REPLACED = {
    "openrlhf": {
        "torch-npu": "replaced by the CPU run's stand-in (smoke_tests/cpu_standins/torch_npu: no device), so that the fork takes the "
        "NPU path its image takes (openrlhf/__init__.py picks it by whether torch_npu can be found); DeepSpeed is told to use its "
        "cpu accelerator (DS_ACCELERATOR=cpu) where the image's picks npu",
    }
}
# Source builds that compile against torch: built after it, in the environment (no build isolation), as the image does.
BUILD_ENV: dict[str, tuple[tuple[str, str], ...]] = {"deepspeed": (("DS_BUILD_OPS", "0"),), "vllm": (("VLLM_TARGET_DEVICE", "empty"),)}


@dataclass(frozen=True)
class CpuEnvPlan:
    stack_id: str
    requirements: tuple[str, ...]  # name==version, the image's
    source: str  # the lock they came from, or "resolved here"
    left_out: tuple[tuple[str, str, str], ...]  # (package, version, why)
    torch_wheel: Path
    stack_torch: str
    builds: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()  # (name==version, build env): from the sdist, after torch
    framework_tree: Path | None = None  # the framework's source tree, where the stack builds it from git
    framework_env: tuple[tuple[str, str], ...] = ()

    def left_out_report(self) -> list[dict[str, str]]:
        items = [{"package": f"{name}=={version}" if version else name, "why": why} for name, version, why in self.left_out]
        for requirement, env in self.builds:
            how = " ".join(f"{k}={v}" for k, v in env)
            why = f"built from its sdist against the CPU torch, {how or 'as the image builds it'}"
            items.append({"package": f"{requirement} (built here)", "why": why})
        items.append(
            {
                "package": f"torch=={self.stack_torch} (CPU build)",
                "why": f"download.pytorch.org is unreachable here: replaced by {self.torch_wheel.name}, a CPU build of another release",
            }
        )
        return items


def _from_lock(loaded: LoadedMatrix, stack_id: str) -> tuple[list[tuple[str, str]], str] | None:
    stack = loaded.matrix.stacks[stack_id]
    for arch in sorted(stack.arches, key=lambda a: a != "x86_64"):
        path = loaded.path.parent / LockTarget(stack_id, arch).path
        if not path.is_file():
            continue
        lock = read_lock(path)
        if lock.header.get("status") == "resolved":
            return [(p.name, p.version) for layer in lock.layers.values() for p in layer], str(path.relative_to(loaded.path.parent))
    return None


def _kept_name(name: str) -> bool:
    """Whether a distribution of the image is installed in its CPU environment (torch comes as the wheel given)."""
    return canon(name) not in LEFT_OUT and canon(name) != "torch"


def _kept(requirement: str) -> bool:
    return _kept_name(Requirement(requirement).name)


def _resolved_here(loaded: LoadedMatrix, stack_id: str, torch_wheel: Path, work: Path) -> list[tuple[str, str]]:
    """uv's resolution of the stack's pins (less what is left out) with its source builds' requirements."""
    from buildkit.lock.index import IndexClient
    from buildkit.lock.sdist import SdistReader

    inputs = lock_inputs(loaded, LockTarget(stack_id, "x86_64"))
    roots = [r for _, layer in inputs.layers for r in layer if _kept(r)]
    reader = SdistReader(IndexClient())
    for dist, version in inputs.source_builds:  # what the image's source builds bring, but for what is left out
        meta = reader.metadata(loaded.matrix.indexes["pypi"].url, dist, version, inputs.project_of(dist))
        roots += [r for r in meta.requires if _kept(r)]
    work.mkdir(parents=True, exist_ok=True)
    (work / "roots.txt").write_text("\n".join([*roots, f"torch @ {torch_wheel.as_uri()}"]) + "\n", encoding="utf-8")
    (work / "constraints.txt").write_text("\n".join(inputs.constraints) + "\n", encoding="utf-8")
    (work / "overrides.txt").write_text("\n".join(inputs.overrides) + "\n", encoding="utf-8")
    argv = [uv_binary(), "pip", "compile", "--quiet", "--python-version", PYTHON, "--no-header", "--no-annotate"]
    argv += ["-c", str(work / "constraints.txt"), "--override", str(work / "overrides.txt"), str(work / "roots.txt")]
    argv += [f"--no-emit-package={name}" for name in sorted(LEFT_OUT)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise InputError(f"{stack_id}: its CPU environment does not resolve: {done.stderr.strip()[-800:]}")
    pairs = []
    for line in done.stdout.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and canon(name) != "torch":
            pairs.append((name, version.split()[0]))
    return pairs


def plan_env(loaded: LoadedMatrix, stack_id: str, torch_wheel: Path, work: Path, framework_tree: Path | None = None) -> CpuEnvPlan:
    if stack_id not in loaded.matrix.stacks:
        raise InputError(f"unknown --stack {stack_id!r}; the matrix has: {', '.join(loaded.matrix.stacks)}")
    if not torch_wheel.is_file():
        raise InputError(f"--torch-wheel {torch_wheel}: no such file (a CPU build of torch for CPython {PYTHON})")
    stack = loaded.matrix.stacks[stack_id]
    source = stack.framework_source
    if source is not None and framework_tree is None:
        raise InputError(f"{stack_id}: its {stack.framework} is built from {source.repo} at {source.ref}: give that source tree")
    found = _from_lock(loaded, stack_id)
    pairs, found_in = found if found is not None else (_resolved_here(loaded, stack_id, torch_wheel, work), "resolved here by uv")
    built_here = BUILT_HERE.get(stack.framework, {})
    why = {**LEFT_OUT, **REPLACED.get(stack.framework, {})}
    kept = tuple(f"{n}=={v}" for n, v in pairs if _kept_name(n))
    left = tuple(sorted((canon(n), v, why[canon(n)]) for n, v in pairs if canon(n) in LEFT_OUT and canon(n) not in built_here))
    builds = []
    for component in ("vllm", "vllm_ascend", "sglang", "torch_npu", "triton_ascend"):  # pins built or fetched outside the lock
        pin = stack.pins().get(component)
        dist = canon(pin.dist(component)) if pin is not None else ""
        if pin is not None and dist in built_here:
            builds.append((f"{dist}=={pin.version}", built_here[dist]))
        elif pin is not None and dist not in {n for n, _, _ in left}:
            left += ((dist, pin.version, why[dist]),)
    from_source = {canon(pin.dist(c)) for c, pin in stack.pins().items() if pin.build_from_source}
    for requirement in kept:  # kept source builds (DeepSpeed) compile against the torch installed first
        name = canon(requirement.split("==")[0])
        if name in from_source:
            builds.insert(0, (requirement, BUILD_ENV.get(name, ())))
    kept = tuple(r for r in kept if r not in {b for b, _ in builds})
    torch_pin = stack.pins().get("torch")
    framework_env = tuple(sorted(source.install_env.items())) if source is not None else ()
    return CpuEnvPlan(
        stack_id, kept, found_in, tuple(sorted(left)), torch_wheel, torch_pin.version if torch_pin else "?",
        tuple(builds), framework_tree, framework_env,
    )  # fmt: skip


def make_env(plan: CpuEnvPlan, venv: Path, python: str = sys.executable) -> Path:
    """Create the venv and install the plan into it, dependencies as the lock has them (``--no-deps``)."""
    uv = uv_binary()
    work = venv.with_name(venv.name + "-inputs")
    work.mkdir(parents=True, exist_ok=True)
    (work / "requirements.txt").write_text("\n".join(plan.requirements) + "\n", encoding="utf-8")
    steps = [
        [uv, "venv", "--quiet", "--allow-existing", "--python", python, str(venv)],
        [
            uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(venv / "bin" / "python"),
            "--no-deps",
            "-r",
            str(work / "requirements.txt"),
            str(plan.torch_wheel),
        ],
    ]
    into = [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "--no-deps", "--no-build-isolation"]
    runs: list[tuple[list[str], dict[str, str]]] = [(argv, {}) for argv in steps]
    runs += [([*into, "--no-binary", requirement.split("==")[0], requirement], dict(env)) for requirement, env in plan.builds]
    if plan.framework_tree is not None:
        runs.append(([*into, str(plan.framework_tree)], dict(plan.framework_env)))
    for argv, env in runs:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800, env={**os.environ, **env})
        if done.returncode != 0:
            raise Unavailable(f"{plan.stack_id}: installing its CPU environment failed: {done.stderr.strip()[-800:]}")
    return venv / "bin" / "python"
