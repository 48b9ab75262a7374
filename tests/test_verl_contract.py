"""The smoke job against the real verl each stack carries: its PyPI wheel's own Hydra config and
reward code, not our expectations of them.

For every stack x SKU, the job is filled exactly as ``ascendkit smoke`` fills it (``build_job``
with the image's verl) and as ``ascendkit k8s render`` writes it (parsed back out of the
manifests, one node and two), composed by Hydra from that verl's ``ppo_trainer`` config in struct
mode (a key verl does not define fails), and put through verl's start-up checks.
"""

from __future__ import annotations

import importlib
import importlib.util
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version

from buildkit.k8s.render import K8sRequest, as_documents, render
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.run.job import DEVICE_OVERRIDE, JOB_FILE, ImageJob, Job, build_job, load_job
from buildkit.run.verlconfig import check_config
from tests.conftest import MATRIX
from tests.test_smoke import gsm8k_generator
from tests.upstream import compose_ppo_trainer, config_dir, verl_importable

SHIPPED = load_matrix(MATRIX)
STACK_SKUS = [(stack_id, sku_id) for stack_id, st in SHIPPED.matrix.stacks.items() for sku_id in st.skus]
VERLS = sorted({st.verl.version for st in SHIPPED.matrix.stacks.values()}, key=Version)
DIGEST = "127.0.0.1:5000/ascendkit/verl@sha256:" + "ab" * 32


def _smoke_job(loaded: LoadedMatrix, stack_id: str, sku_id: str, *, extra: tuple[str, ...] = ()) -> Job:
    st = loaded.matrix.stacks[stack_id]
    return build_job(
        load_job(),
        loaded.matrix.skus[sku_id],
        ImageJob(stack_id, st.verl.version),
        first_autodetect=loaded.matrix.compat.verl_npu_autodetect,
        steps=5,
        extra=extra,
    )


def _k8s_overrides(loaded: LoadedMatrix, stack_id: str, sku_id: str, nodes: int, kind: str = "kuberay") -> list[str]:
    """The Hydra overrides as the rendered manifests carry them to the cluster: the Job's args, the
    RayJob's entrypoint, or (``kind="volcano"``) what the Volcano Job's head runs once Ray is up."""
    st = loaded.matrix.stacks[stack_id]
    request = K8sRequest(
        sku_id=sku_id,
        sku=loaded.matrix.skus[sku_id],
        image=DIGEST,
        nodes=nodes,
        image_job=ImageJob(stack_id, st.verl.version),
        first_autodetect=loaded.matrix.compat.verl_npu_autodetect,
        scheduler="volcano" if kind == "volcano" else "default",
        kuberay=kind != "volcano",
    )
    (workload,) = [d for d in as_documents(render(request).text) if d["kind"] != "ConfigMap"]
    if request.kind == "Job":
        argv = workload["spec"]["template"]["spec"]["containers"][0]["args"]
    elif request.kind == "RayJob":
        argv = shlex.split(workload["spec"]["entrypoint"])
    else:
        head = workload["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["args"]
        assert head[:2] == ["bash", "-c"] and '"$@"' in head[2], "the head script runs its arguments: the job"
        argv = head[4:]
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    return [str(a) for a in argv[3:]]


def _composed(verl: str, overrides: list[str]) -> dict[str, Any]:
    from omegaconf import OmegaConf

    config = compose_ppo_trainer(verl, overrides)
    assert OmegaConf.is_struct(config), "verl's config must be composed in struct mode, as main_ppo runs it"
    data: dict[str, Any] = OmegaConf.to_container(config, resolve=False)  # type: ignore[assignment]
    return data


def _assert_passes(loaded: LoadedMatrix, stack_id: str, config: dict[str, Any]) -> None:
    verl = loaded.matrix.stacks[stack_id].verl.version
    checks = check_config(config, verl=verl, first_autodetect=loaded.matrix.compat.verl_npu_autodetect)
    failed = [f"{c.name}: {c.detail}" for c in checks if c.status != "ok"]
    assert not failed, f"{stack_id} (verl {verl}): {failed}"
    autodetects = Version(verl) >= Version(loaded.matrix.compat.verl_npu_autodetect)
    assert config["trainer"]["device"] == ("cuda" if autodetects else "npu")


@pytest.mark.parametrize(("stack_id", "sku_id"), STACK_SKUS)
def test_smoke_job_composes_with_the_stacks_verl(loaded: LoadedMatrix, stack_id: str, sku_id: str) -> None:
    job = _smoke_job(loaded, stack_id, sku_id)
    config = _composed(loaded.matrix.stacks[stack_id].verl.version, list(job.overrides))
    _assert_passes(loaded, stack_id, config)
    assert config["trainer"]["n_gpus_per_node"] == loaded.matrix.skus[sku_id].npus_per_node
    assert config["trainer"]["total_training_steps"] == 5


@pytest.mark.parametrize(("stack_id", "sku_id"), STACK_SKUS)
@pytest.mark.parametrize(("nodes", "kind"), [(1, "kuberay"), (2, "kuberay"), (2, "volcano")])
def test_k8s_job_composes_with_the_stacks_verl(loaded: LoadedMatrix, stack_id: str, sku_id: str, nodes: int, kind: str) -> None:
    overrides = _k8s_overrides(loaded, stack_id, sku_id, nodes, kind)
    config = _composed(loaded.matrix.stacks[stack_id].verl.version, overrides)
    _assert_passes(loaded, stack_id, config)
    assert config["trainer"]["nnodes"] == nodes
    # Kubernetes runs exactly what smoke runs, but for the nodes and where the data is generated.
    smoke = _smoke_job(loaded, stack_id, sku_id)
    assert len(overrides) == len(smoke.overrides)
    assert {o.split("=")[0] for o in overrides} == {o.split("=")[0] for o in smoke.overrides}


def test_default_stack_needs_and_gets_the_device_override(loaded: LoadedMatrix) -> None:
    """verl 0.6.1 (cann8.3) has no NPU auto-detection: without the override its job waits for GPUs."""
    default = next(s for s, st in loaded.matrix.stacks.items() if st.default)
    verl = loaded.matrix.stacks[default].verl.version
    assert "auto_set_device" not in (config_dir(verl).parent / "main_ppo.py").read_text(encoding="utf-8")
    job = _smoke_job(loaded, default, "a3")
    assert DEVICE_OVERRIDE in job.overrides
    without = [o for o in job.overrides if o != DEVICE_OVERRIDE]
    checks = check_config(_composed(verl, without), verl=verl, first_autodetect=loaded.matrix.compat.verl_npu_autodetect)
    assert [c.status for c in checks if c.name == "device"] == ["error"]


@pytest.mark.parametrize("verl", VERLS)
def test_autodetect_fact_matches_the_wheel(loaded: LoadedMatrix, verl: str) -> None:
    """The matrix's fact agrees with each shipped verl: main_ppo calls auto_set_device exactly from it on."""
    main_ppo = (config_dir(verl).parent / "main_ppo.py").read_text(encoding="utf-8")
    autodetects = Version(verl) >= Version(loaded.matrix.compat.verl_npu_autodetect)
    assert ("auto_set_device(config)" in main_ppo) == autodetects


def test_a_misspelled_override_fails_composition(loaded: LoadedMatrix) -> None:
    from hydra.errors import ConfigCompositionException

    job = _smoke_job(loaded, "cann8.3", "a3", extra=("actor_rollout_ref.rollout.gpu_memory_utilisation=0.6",))
    with pytest.raises(ConfigCompositionException) as caught:
        compose_ppo_trainer(loaded.matrix.stacks["cann8.3"].verl.version, list(job.overrides))
    assert "gpu_memory_utilisation" in str(caught.value) + str(caught.value.__cause__)


def test_a_misspelled_key_in_the_job_file_fails(loaded: LoadedMatrix, tmp_path: Path) -> None:
    text = JOB_FILE.read_text(encoding="utf-8")
    bad = tmp_path / "grpo_smoke.yaml"
    bad.write_text(text.replace("actor_rollout_ref.actor.kl_loss_type", "actor_rollout_ref.actor.kl_loss_typ"), encoding="utf-8")
    st = loaded.matrix.stacks["cann9.1"]
    job = build_job(
        load_job(bad),
        loaded.matrix.skus["a3"],
        ImageJob("cann9.1", st.verl.version),
        first_autodetect=loaded.matrix.compat.verl_npu_autodetect,
        steps=5,
    )
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_ppo_trainer(st.verl.version, list(job.overrides))


def test_two_nodes_get_enough_rows_for_every_step(loaded: LoadedMatrix) -> None:
    """16 NPUs x 2 nodes x 2 prompts = a batch of 64: 5 steps need 320 rows, not the default 256."""
    st = loaded.matrix.stacks["cann8.3"]
    job = build_job(
        load_job(),
        loaded.matrix.skus["a2-box16"],
        ImageJob("cann8.3", st.verl.version),
        first_autodetect="0.7.0",
        steps=5,
        nnodes=2,
    )
    assert job.batch == 64
    assert job.train_rows >= job.batch * job.steps
    assert job.data_command()[-2:] == ["--train", str(job.train_rows)]


# ---- the data against verl's own reward ------------------------------------------------------------


def _score(value: Any) -> float:
    return float(value["score"] if isinstance(value, dict) else value)


@pytest.mark.parametrize("verl", VERLS)
def test_generated_rows_score_with_verls_gsm8k_reward(verl: str) -> None:
    """main_ppo's reward manager calls default_compute_score(data_source, response, ground_truth):
    the worked answer of every generated row scores 1, a wrong final number scores 0."""
    rows = gsm8k_generator().rows("train", 64, 0)
    with verl_importable(verl):
        rewards = importlib.import_module("verl.utils.reward_score")
        for row in rows:
            answer, truth = row["extra_info"]["answer"], row["reward_model"]["ground_truth"]
            assert _score(rewards.default_compute_score(row["data_source"], answer, truth)) == 1.0, answer
            wrong = answer.rsplit("####", 1)[0] + f"#### {int(truth) + 1}"
            assert _score(rewards.default_compute_score(row["data_source"], wrong, truth)) == 0.0, wrong


@pytest.mark.parametrize("verl", VERLS)
def test_generated_columns_are_the_ones_verl_reads(verl: str) -> None:
    """The dataset reads data.prompt_key and the reward manager data.reward_fn_key and
    reward_model.ground_truth: the keys come from that verl's composed config and source."""
    data = _composed(verl, [])["data"]
    row = gsm8k_generator().rows("train", 1, 0)[0]
    assert data["prompt_key"] in row and isinstance(row[data["prompt_key"]], list)
    assert row[data["prompt_key"]][0]["role"] == "user"
    assert data["reward_fn_key"] in row and row[data["reward_fn_key"]] == "openai/gsm8k"
    verl_root = config_dir(verl).parent.parent
    naive = (verl_root / "workers" / "reward_manager" / "naive.py").read_text(encoding="utf-8")
    assert '["reward_model"]["ground_truth"]' in naive and "ground_truth" in row["reward_model"]
    dataset = (verl_root / "utils" / "dataset" / "rl_dataset.py").read_text(encoding="utf-8")
    assert 'get("extra_info", {}).get("index"' in dataset and isinstance(row["extra_info"]["index"], int)


def test_job_file_overrides_match_the_shipped_yaml() -> None:
    """The job file stays plain: what depends on the image is derived, not listed per stack."""
    raw = yaml.safe_load((Path(__file__).resolve().parent.parent / "smoke_tests" / "grpo_smoke.yaml").read_text(encoding="utf-8"))
    assert "stacks" not in raw
    assert not any(o.startswith("trainer.device") for o in raw["overrides"])
