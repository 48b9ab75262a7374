"""The default stack's real Python layers on arm64, and verl's own code running the smoke job's config.

In the arm64 stand-in base (qemu), the committed cann8.3 aarch64 lock sections are installed by the
image's own ``ascendkit_install`` (build-env.sh: uv, in layer order, ``--require-hashes``, no build
isolation; bytecode compiled only for what the tests import, see WARM), offline from a wheelhouse
`ascendkit wheelhouse` fills and keeps between runs, as ``build --offline`` would. Left out, because they need
CANN at build time: the vllm and vllm-ascend source builds themselves (their dependencies are
installed) and the MindSpeed/Megatron checkouts (GitHub and gitcode are out of reach here).

torch_npu cannot load without CANN (``libhccl.so``), and neither transformers nor verl falls back
when the import fails that way: ``transformers.utils.is_torch_npu_available`` lets the ImportError
through while importing main_ppo. The one stand-in here is therefore a ``sitecustomize`` that
marks torch_npu as absent (``sys.modules["torch_npu"] = None``), which is what an image without
torch_npu would look like to them; torch's own backend autoload is turned off by the config check
itself (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, a torch switch, not a stub).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from buildkit.matrix.load import load_matrix
from buildkit.plan import LABEL_PREFIX
from buildkit.resources import SMOKE_DIR
from buildkit.run.job import ImageJob, JobFacts, build_job, load_job
from tests.conftest import MATRIX, ROOT, DockerEnv, arm64_standin
from tests.harness.locked_install import BUILD_ENV, install_script, run_install, write_sections
from tests.harness.upstream import CACHE_ROOT

pytestmark = [pytest.mark.docker, pytest.mark.emulated]

LOADED = load_matrix(MATRIX)
STACK_ID = next(s for s, st in LOADED.matrix.stacks.items() if st.default)
STACK = LOADED.matrix.stacks[STACK_ID]
SOURCE_BUILDS = frozenset({"vllm", "vllm-ascend"})  # need CANN to build: out of scope here

STANDIN_SITE = """\
# STAND-IN (ascendkit CI): this image holds torch_npu's wheel but no CANN, so torch_npu cannot load
# (libhccl.so is missing) and transformers lets that ImportError through. Mark it absent, which is
# how transformers and verl see an image without torch_npu.
import sys

sys.modules["torch_npu"] = None
"""

# The template's system step is not run here: what it installs that main_ppo's imports need
# (libsndfile1, for soundfile) the stand-in base carries, as it carries the step's other packages.
SETUP = """\
dpkg -s libsndfile1 >/dev/null
mkdir -p /opt/ascendkit-standin && cp /mnt/standin/sitecustomize.py /opt/ascendkit-standin/
"""

# The imports the tests make (GRPO's main_ppo and verl's validation, SFT's fsdp_sft_trainer), once,
# before the image is committed: their bytecode goes into it, as the image's own build compiles every
# module's. Compiling all of it here would take minutes more under emulation; without any, each test
# compiles torch, sympy and the rest again.
WARM = """\
SECONDS=0
TORCH_DEVICE_BACKEND_AUTOLOAD=0 PYTHONPATH=/opt/ascendkit-standin \\
  python3 -c 'import hydra, verl.trainer.main_ppo, verl.utils.config, verl.trainer.fsdp_sft_trainer'
echo "imports warmed in ${SECONDS} s"
"""

# verl's own start-up validation (verl/utils/config.py) on the job's config, composed by verl's
# Hydra config module; run in the image for one node and for two.
VALIDATE = """\
import json, sys
from importlib.metadata import version
from hydra import compose, initialize_config_module
from verl.trainer.ppo.utils import need_critic
from verl.utils.config import validate_config

results = {}
for name, overrides in json.loads(sys.argv[1]).items():
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    validate_config(config, use_reference_policy=True, use_critic=need_critic(config))
    results[name] = {"device": config.trainer.device, "world": config.trainer.n_gpus_per_node * config.trainer.nnodes}
    from hydra.core.global_hydra import GlobalHydra
    GlobalHydra.instance().clear()
packages = ["uv", "torch", "torch-npu", "torchvision", "triton-ascend", "transformers", "verl", "pyarrow", "numpy"]
print("RESULT " + json.dumps({"configs": results, "versions": {p: version(p) for p in packages}}))
"""


@pytest.fixture(scope="session")
def layers_image(docker_env: DockerEnv, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The arm64 stand-in with the default stack's locked layers installed, labelled like a build
    of it; cached on the engine under a tag derived from everything that goes into it."""
    base = arm64_standin()
    tmp = tmp_path_factory.mktemp("layers")
    sections_dir = tmp / "sections"
    sections_dir.mkdir()
    sections = write_sections(LOADED, STACK_ID, "aarch64", sections_dir, drop=SOURCE_BUILDS)
    standin_dir = tmp / "standin"
    standin_dir.mkdir()
    (standin_dir / "sitecustomize.py").write_text(STANDIN_SITE, encoding="utf-8")
    # bytecode is a cache: all of it under emulation is minutes this test does not need (WARM compiles what it imports)
    script = install_script(LOADED, STACK_ID, "aarch64", "uv", setup=SETUP, compile_bytecode=False) + WARM
    digest = hashlib.sha256()
    parts = [docker_env.client.inspect_image(base)["Id"], script, BUILD_ENV.read_text(), STANDIN_SITE]
    for part in parts + [p.read_text() for p in sections]:
        digest.update(part.encode())
    tag = f"ascendkit-it/{STACK_ID}-aarch64-layers:{digest.hexdigest()[:16]}"
    if docker_env.client.images(name=tag):
        return tag
    wheelhouse = CACHE_ROOT / "wheelhouse" / f"{STACK_ID}-aarch64"
    docker_env.ascendkit("wheelhouse", "--stack", STACK_ID, "--arch", "aarch64", "-o", str(wheelhouse), cwd=ROOT, check=True)
    client = docker_env.client
    # A hang guard, not a speed limit: on an engine that has not cached this image (a fresh CI machine) the
    # install under qemu took 28 min beside `make test`'s other jobs in one run and ran past 30 in the next.
    installed = run_install(client, base, script, sections_dir, wheelhouse, {str(standin_dir): "/mnt/standin"}, timeout=3600)
    container = installed.container
    try:
        assert installed.exit_code == 0, f"installing the {STACK_ID} aarch64 lock sections failed:\n{installed.log[-4000:]}"
        labels = {
            f"{LABEL_PREFIX}.chip": "a3",
            f"{LABEL_PREFIX}.stack": STACK_ID,
            f"{LABEL_PREFIX}.version.verl": STACK.framework_version,
            "io.ascendkit.standin": "true",
        }
        changes = [f'LABEL {k}="{v}"' for k, v in labels.items()] + ["ENV PYTHONPATH=/opt/ascendkit-standin", 'CMD ["/bin/bash"]']
        client.commit(container, repository=tag.split(":")[0], tag=tag.split(":")[1], changes=changes)
    finally:
        client.remove_container(container, force=True)
    return tag


def test_smoke_check_composes_the_job_with_the_real_verl_in_the_image(docker_env: DockerEnv, layers_image: str, tmp_path: Path) -> None:
    """`ascendkit smoke --check`, as a user runs it: main_ppo --cfg job in the image, then the checks."""
    out = tmp_path / "check"
    proc = docker_env.ascendkit(
        "smoke", "--check", "--hw", "a3", "--image", layers_image, "--out", str(out), "--timeout", "1500", "--matrix", str(MATRIX),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:] + (out / "config-check.log").read_text()[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"] == "checked" and report["config_check"]["passed"]
    assert {c["name"]: c["status"] for c in report["config_check"]["checks"]} == {
        "device": "ok",
        "batch split": "ok",
        "mini-batches": "ok",
        "rollout parallelism": "ok",
        "reward function": "ok",
    }
    printed = (out / "job-config.yaml").read_text()
    assert re.search(r"^  device: npu$", printed, re.M), "verl 0.6.1 composed trainer.device=npu from our override"
    assert re.search(r"^  n_gpus_per_node: 16$", printed, re.M)


@pytest.mark.parametrize(("override", "expected"), [(None, 0), ("model.lora_rnk=8", 1)], ids=["as-shipped", "planted-bad-key"])
def test_smoke_check_composes_the_sft_job_with_the_real_verl_in_the_image(
    docker_env: DockerEnv, layers_image: str, tmp_path: Path, override: str | None, expected: int
) -> None:
    """`ascendkit smoke --check --job sft`: fsdp_sft_trainer --cfg job in the image (verl 0.6.1's SFT
    entry point, by compat.verl_sft_trainer), then the SFT checks; a key verl does not define fails
    there with Hydra's own message."""
    out = tmp_path / "sft"
    argv = ["smoke", "--check", "--job", "sft", "--hw", "a3", "--image", layers_image, "--out", str(out), "--timeout", "1500"]
    proc = docker_env.ascendkit(*argv, *(["--override", override] if override else []), "--matrix", str(MATRIX), cwd=tmp_path)
    log = (out / "config-check.log").read_text() if (out / "config-check.log").exists() else ""
    assert proc.returncode == expected, proc.stderr[-3000:] + log[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["config_check"]["command"][:3] == ["python3", "-m", "verl.trainer.fsdp_sft_trainer"]
    if override is None:
        assert report["outcome"] == "checked"
        assert {c["name"]: c["status"] for c in report["config_check"]["checks"]} == {"device": "ok", "batch split": "ok", "LoRA": "ok"}
        printed = (out / "job-config.yaml").read_text()
        assert re.search(r"^  device: npu$", printed, re.M) and re.search(r"^  lora_rank: 32$", printed, re.M)
    else:
        assert report["outcome"] == "failed"
        assert "verl refused the job's config" in report["message"] and "lora_rnk" in report["message"]


def test_verls_own_validation_accepts_the_job_for_one_and_two_nodes(docker_env: DockerEnv, layers_image: str) -> None:
    """verl's validate_config (upstream code, in the image) on the smoke job and the 2-node Kubernetes job;
    and every locked package is installed at its locked version."""
    jobs = {
        f"{nodes}-node": list(
            build_job(
                load_job(SMOKE_DIR / "grpo_smoke.yaml"),
                LOADED.matrix.skus["a3"],
                ImageJob(STACK_ID, STACK.framework_version),
                facts=JobFacts.of(LOADED.matrix.compat),
                steps=5,
                nnodes=nodes,
            ).overrides
        )
        for nodes in (1, 2)
    }
    client = docker_env.client
    container = client.create_container(
        layers_image, command=["python3", "-c", VALIDATE, json.dumps(jobs)], environment={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    )
    try:
        client.start(container)
        code = client.wait(container, timeout=1500)["StatusCode"]
        log = client.logs(container).decode("utf-8", "replace")
    finally:
        client.remove_container(container, force=True)
    assert code == 0, log[-4000:]
    assert log.count("[validate_config] All configuration checks passed successfully!") == 2
    result = json.loads(log.split("RESULT ", 1)[1].splitlines()[0])
    assert result["configs"] == {"1-node": {"device": "npu", "world": 16}, "2-node": {"device": "npu", "world": 32}}
    locked = {
        m[1].lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9._-]+)==(\S+)", (ROOT / f"locks/{STACK_ID}-aarch64.txt").read_text(), re.M)
    }
    for package, installed in result["versions"].items():
        assert installed == locked[package], f"{package} {installed} is not the locked {locked[package]}"
