"""verl's smoke jobs (GRPO and SFT) against the real verl each stack carries: its PyPI wheel's own
Hydra configs, entry points and reward code, not our expectations of them.

For every stack x SKU x job, the job is filled exactly as ``ascendkit smoke`` fills it
(``build_job`` with the image's verl) and as ``ascendkit k8s render`` writes it (parsed back out of
the manifests: GRPO on one node and two, SFT on one), composed by Hydra from the config that
verl's entry point names in its ``@hydra.main`` (struct mode: a key verl does not define fails),
and put through verl's start-up checks.
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

from buildkit.frameworks.verl.config import check_config, check_sft_config
from buildkit.frameworks.verl.releases import DEVICE_OVERRIDE
from buildkit.k8s.render import as_documents, render
from buildkit.k8s.request import K8sRequest
from buildkit.matrix.load import LoadedMatrix, load_matrix
from buildkit.resources import SMOKE_DIR
from buildkit.run.job import ImageJob, Job, JobFacts, build_job, load_job, spec_for
from tests.conftest import MATRIX
from tests.harness.upstream import compose_config, compose_ppo_trainer, config_dir, hydra_config_name, verl_importable, verl_wheel
from tests.test_smoke import gsm8k_generator

SHIPPED = load_matrix(MATRIX)
GRPO_FILE = SMOKE_DIR / "grpo_smoke.yaml"  # verl's GRPO job
VERL_STACKS = {stack_id: st for stack_id, st in SHIPPED.matrix.stacks.items() if st.framework == "verl"}
STACK_SKUS = [(stack_id, sku_id) for stack_id, st in VERL_STACKS.items() for sku_id in st.skus]
VERLS = sorted({st.framework_version for st in VERL_STACKS.values()}, key=Version)
DIGEST = "127.0.0.1:5000/ascendkit/verl@sha256:" + "ab" * 32


def _facts(loaded: LoadedMatrix) -> JobFacts:
    return JobFacts.of(loaded.matrix.compat)


def _smoke_job(loaded: LoadedMatrix, stack_id: str, sku_id: str, *, extra: tuple[str, ...] = (), job: str = "grpo") -> Job:
    image = ImageJob.of(stack_id, loaded.matrix.stacks[stack_id])
    return build_job(spec_for(image, job, _facts(loaded)), loaded.matrix.skus[sku_id], image, facts=_facts(loaded), steps=5, extra=extra)


def _k8s_argv(loaded: LoadedMatrix, stack_id: str, sku_id: str, nodes: int, kind: str = "kuberay", job: str = "smoke") -> list[str]:
    """The command as the rendered manifests carry it to the cluster: the Job's args, the RayJob's
    entrypoint, or (``kind="volcano"``) what the Volcano Job's head runs once Ray is up."""
    st = loaded.matrix.stacks[stack_id]
    request = K8sRequest(
        sku_id=sku_id,
        sku=loaded.matrix.skus[sku_id],
        image=DIGEST,
        nodes=nodes,
        job=job,
        image_job=ImageJob.of(stack_id, st),
        facts=_facts(loaded),
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
    return [str(a) for a in argv]


def _k8s_overrides(loaded: LoadedMatrix, stack_id: str, sku_id: str, nodes: int, kind: str = "kuberay") -> list[str]:
    argv = _k8s_argv(loaded, stack_id, sku_id, nodes, kind)
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    return argv[3:]


def _composed(verl: str, overrides: list[str]) -> dict[str, Any]:
    from omegaconf import OmegaConf

    config = compose_ppo_trainer(verl, overrides)
    assert OmegaConf.is_struct(config), "verl's config must be composed in struct mode, as main_ppo runs it"
    data: dict[str, Any] = OmegaConf.to_container(config, resolve=False)  # type: ignore[assignment]
    return data


def _assert_passes(loaded: LoadedMatrix, stack_id: str, config: dict[str, Any]) -> None:
    verl = loaded.matrix.stacks[stack_id].framework_version
    checks = check_config(
        config,
        verl=verl,
        first_autodetect=loaded.matrix.compat.verl_npu_autodetect,
        legacy_reward_ignored=loaded.matrix.compat.verl_legacy_reward_ignored,
    )
    failed = [f"{c.name}: {c.detail}" for c in checks if c.status != "ok"]
    assert not failed, f"{stack_id} (verl {verl}): {failed}"
    autodetects = Version(verl) >= Version(loaded.matrix.compat.verl_npu_autodetect)
    assert config["trainer"]["device"] == ("cuda" if autodetects else "npu")


@pytest.mark.parametrize(("stack_id", "sku_id"), STACK_SKUS)
def test_smoke_job_composes_with_the_stacks_verl(loaded: LoadedMatrix, stack_id: str, sku_id: str) -> None:
    job = _smoke_job(loaded, stack_id, sku_id)
    config = _composed(loaded.matrix.stacks[stack_id].framework_version, list(job.overrides))
    _assert_passes(loaded, stack_id, config)
    assert config["trainer"]["n_gpus_per_node"] == loaded.matrix.skus[sku_id].npus_per_node
    assert config["trainer"]["total_training_steps"] == 5


@pytest.mark.parametrize(("stack_id", "sku_id"), STACK_SKUS)
@pytest.mark.parametrize(("nodes", "kind"), [(1, "kuberay"), (2, "kuberay"), (2, "volcano")])
def test_k8s_job_composes_with_the_stacks_verl(loaded: LoadedMatrix, stack_id: str, sku_id: str, nodes: int, kind: str) -> None:
    overrides = _k8s_overrides(loaded, stack_id, sku_id, nodes, kind)
    config = _composed(loaded.matrix.stacks[stack_id].framework_version, overrides)
    _assert_passes(loaded, stack_id, config)
    assert config["trainer"]["nnodes"] == nodes
    # Kubernetes runs exactly what smoke runs, but for the nodes and where the data is generated.
    smoke = _smoke_job(loaded, stack_id, sku_id)
    assert len(overrides) == len(smoke.overrides)
    assert {o.split("=")[0] for o in overrides} == {o.split("=")[0] for o in smoke.overrides}


def test_a_verl_without_npu_autodetection_needs_and_gets_the_device_override(loaded: LoadedMatrix) -> None:
    """verl 0.6.1 (cann8.3) has no NPU auto-detection: without the override its job waits for GPUs."""
    default = "cann8.3"
    verl = loaded.matrix.stacks[default].framework_version
    assert "auto_set_device" not in (config_dir(verl).parent / "main_ppo.py").read_text(encoding="utf-8")
    job = _smoke_job(loaded, default, "a3")
    assert DEVICE_OVERRIDE in job.overrides
    without = [o for o in job.overrides if o != DEVICE_OVERRIDE]
    checks = check_config(
        _composed(verl, without),
        verl=verl,
        first_autodetect=loaded.matrix.compat.verl_npu_autodetect,
        legacy_reward_ignored=loaded.matrix.compat.verl_legacy_reward_ignored,
    )
    assert [c.status for c in checks if c.name == "device"] == ["error"]


@pytest.mark.parametrize("verl", VERLS)
def test_autodetect_fact_matches_the_wheel(loaded: LoadedMatrix, verl: str) -> None:
    """The matrix's fact agrees with each shipped verl: main_ppo calls auto_set_device exactly from it on."""
    main_ppo = (config_dir(verl).parent / "main_ppo.py").read_text(encoding="utf-8")
    autodetects = Version(verl) >= Version(loaded.matrix.compat.verl_npu_autodetect)
    assert ("auto_set_device(config)" in main_ppo) == autodetects


@pytest.mark.parametrize("verl", VERLS)
def test_legacy_reward_fact_matches_the_wheel(loaded: LoadedMatrix, verl: str) -> None:
    """compat.verl_legacy_reward_ignored agrees with each shipped verl: from the reward section's first release (its
    legacy_reward_impl.yaml keeps the old keys) main_ppo moves the old keys under reward: (migrate_legacy_reward_impl),
    up to the fact; from it on no trainer entry point does."""
    trainer = config_dir(verl).parent
    layered = (trainer / "config" / "legacy_reward_impl.yaml").is_file()
    ignored = Version(verl) >= Version(loaded.matrix.compat.verl_legacy_reward_ignored)
    assert ("migrate_legacy_reward_impl(config)" in (trainer / "main_ppo.py").read_text(encoding="utf-8")) == (layered and not ignored)
    if ignored:
        callers = [f.name for f in trainer.glob("*.py") if "migrate_legacy_reward_impl(" in f.read_text(encoding="utf-8")]
        assert layered and callers == [], callers


def _reward_check(loaded: LoadedMatrix, verl: str, config: dict[str, Any]) -> tuple[str, str]:
    compat = loaded.matrix.compat
    checks = check_config(
        config, verl=verl, first_autodetect=compat.verl_npu_autodetect, legacy_reward_ignored=compat.verl_legacy_reward_ignored
    )
    (check,) = [c for c in checks if c.name == "reward function"]
    return check.status, check.detail


@pytest.mark.parametrize("verl", VERLS)
def test_a_reward_function_named_by_a_key_the_verl_no_longer_reads_is_refused(loaded: LoadedMatrix, verl: str) -> None:
    """Hydra takes the old key in every shipped verl; the check refuses it exactly where verl's main_ppo no longer
    moves it, and takes the key verl reads (reward.custom_reward_function, which older verls do not define)."""
    from hydra.errors import ConfigCompositionException

    stack_id = next(s for s, st in VERL_STACKS.items() if st.framework_version == verl)
    job = _smoke_job(loaded, stack_id, "a3")
    reward = "/opt/team/rewards/math.py"
    old = _composed(verl, [*job.overrides, f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score"])
    status, detail = _reward_check(loaded, verl, old)
    if Version(verl) >= Version(loaded.matrix.compat.verl_legacy_reward_ignored):
        assert status == "error" and "custom_reward_function.path -> reward.custom_reward_function.path" in detail, detail
    else:
        assert status == "ok" and detail.startswith(f"compute_score from {reward} (custom_reward_function"), detail
    new = [*job.overrides, f"reward.custom_reward_function.path={reward}"]
    if (config_dir(verl) / "legacy_reward_impl.yaml").is_file():
        assert _reward_check(loaded, verl, _composed(verl, new)) == ("ok", f"compute_score from {reward} (reward.custom_reward_function)")
    else:
        with pytest.raises(ConfigCompositionException):
            _composed(verl, new)


def test_a_misspelled_override_fails_composition(loaded: LoadedMatrix) -> None:
    from hydra.errors import ConfigCompositionException

    job = _smoke_job(loaded, "cann8.3", "a3", extra=("actor_rollout_ref.rollout.gpu_memory_utilisation=0.6",))
    with pytest.raises(ConfigCompositionException) as caught:
        compose_ppo_trainer(loaded.matrix.stacks["cann8.3"].framework_version, list(job.overrides))
    assert "gpu_memory_utilisation" in str(caught.value) + str(caught.value.__cause__)


def test_a_misspelled_key_in_the_job_file_fails(loaded: LoadedMatrix, tmp_path: Path) -> None:
    text = GRPO_FILE.read_text(encoding="utf-8")
    bad = tmp_path / "grpo_smoke.yaml"
    bad.write_text(text.replace("actor_rollout_ref.actor.kl_loss_type", "actor_rollout_ref.actor.kl_loss_typ"), encoding="utf-8")
    st = loaded.matrix.stacks["cann9.1"]
    job = build_job(load_job(bad), loaded.matrix.skus["a3"], ImageJob("cann9.1", st.framework_version), facts=_facts(loaded), steps=5)
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_ppo_trainer(st.framework_version, list(job.overrides))


def test_two_nodes_get_enough_rows_for_every_step(loaded: LoadedMatrix) -> None:
    """16 NPUs x 2 nodes x 2 prompts = a batch of 64: 5 steps need 320 rows, not the default 256."""
    st = loaded.matrix.stacks["cann8.3"]
    image = ImageJob("cann8.3", st.framework_version)
    job = build_job(load_job(GRPO_FILE), loaded.matrix.skus["a2-box16"], image, facts=_facts(loaded), steps=5, nnodes=2)
    assert job.batch == 64
    assert job.train_rows >= job.batch * job.steps
    assert job.data_command()[-4:-2] == ["--train", str(job.train_rows)]


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


@pytest.mark.parametrize("name", ["grpo_smoke.yaml", "sft_smoke.yaml", "sft_engine_smoke.yaml"])
def test_job_file_overrides_match_the_shipped_yaml(name: str) -> None:
    """The job files stay plain: what depends on the image is derived, not listed per stack."""
    raw = yaml.safe_load((Path(__file__).resolve().parent.parent / "smoke_tests" / name).read_text(encoding="utf-8"))
    assert "stacks" not in raw
    assert not any(o.startswith("trainer.device") for o in raw["overrides"])


# ---- the SFT job ---------------------------------------------------------------------------------------


def _sft_config(loaded: LoadedMatrix, stack_id: str, overrides: list[str], module: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    verl = loaded.matrix.stacks[stack_id].framework_version
    config = compose_config(verl, hydra_config_name(verl, module), overrides)
    assert OmegaConf.is_struct(config), "verl's config must be composed in struct mode, as its entry point runs it"
    data: dict[str, Any] = OmegaConf.to_container(config, resolve=False)  # type: ignore[assignment]
    return data


@pytest.mark.parametrize(("stack_id", "sku_id"), STACK_SKUS)
def test_sft_job_composes_with_the_stacks_verl(loaded: LoadedMatrix, stack_id: str, sku_id: str) -> None:
    """The module the fact picks exists in the stack's verl, its @hydra.main config takes every override,
    and the composed config passes the SFT trainer's start-up checks."""
    job = _smoke_job(loaded, stack_id, sku_id, job="sft")
    verl = loaded.matrix.stacks[stack_id].framework_version
    assert (verl_wheel(verl) / Path(*job.module.split("."))).with_suffix(".py").is_file(), f"verl {verl} has no {job.module}"
    config = _sft_config(loaded, stack_id, list(job.overrides), job.module)
    checks = check_sft_config(config, verl=verl, first_engine=loaded.matrix.compat.verl_sft_trainer)
    assert {c.name: c.status for c in checks} == {"device": "ok", "batch split": "ok", "LoRA": "ok"}, checks
    assert config["trainer"]["n_gpus_per_node"] == loaded.matrix.skus[sku_id].npus_per_node
    assert config["trainer"]["total_training_steps"] == 5 and config["model"]["lora_rank"] == 32
    assert job.launcher[-1] == f"--nproc_per_node={config['trainer']['n_gpus_per_node']}", "torchrun starts one rank per NPU"
    # Kubernetes runs exactly the command smoke runs
    assert _k8s_argv(loaded, stack_id, sku_id, 1, job="sft") == job.argv


@pytest.mark.parametrize("verl", VERLS)
def test_sft_entry_point_fact_matches_the_wheel(loaded: LoadedMatrix, verl: str) -> None:
    """compat.verl_sft_trainer agrees with each shipped verl: fsdp_sft_trainer (which never sets the
    device) before it; from it on sft_trainer, whose main() calls auto_set_device."""
    trainer = verl_wheel(verl) / "verl" / "trainer"
    engine = Version(verl) >= Version(loaded.matrix.compat.verl_sft_trainer)
    if engine:
        assert "auto_set_device(config)" in (trainer / "sft_trainer.py").read_text(encoding="utf-8")
    else:
        legacy = (trainer / "fsdp_sft_trainer.py").read_text(encoding="utf-8")
        assert "auto_set_device" not in legacy
    assert (trainer / "fsdp_sft_trainer.py").is_file() == (not engine), "fsdp_sft_trainer is gone exactly from the fact on"


@pytest.mark.parametrize("stack_id", ["cann8.3", "cann9.1"])
def test_a_misspelled_sft_key_fails_composition(loaded: LoadedMatrix, stack_id: str) -> None:
    from hydra.errors import ConfigCompositionException

    job = _smoke_job(loaded, stack_id, "a3", job="sft", extra=("data.micro_batch_size_per_gpus=4",))
    with pytest.raises(ConfigCompositionException) as caught:
        _sft_config(loaded, stack_id, list(job.overrides), job.module)
    assert "micro_batch_size_per_gpus" in str(caught.value) + str(caught.value.__cause__)


@pytest.mark.parametrize("verl", VERLS)
def test_sft_data_has_the_columns_each_sft_trainer_reads(loaded: LoadedMatrix, verl: str) -> None:
    """The generated SFT rows hold what the composed config points the dataset at: extra_info's question
    and answer (fsdp_sft_trainer), a user/assistant conversation under messages_key (sft_trainer)."""
    image = ImageJob("x", verl)
    job = build_job(spec_for(image, "sft", _facts(loaded)), loaded.matrix.skus["a3"], image, facts=_facts(loaded), steps=5)
    config = _sft_config(loaded, next(s for s, st in VERL_STACKS.items() if st.framework_version == verl), list(job.overrides), job.module)
    row = gsm8k_generator().rows("train", 1, 0, job.data_format)[0]
    data = config["data"]
    if "messages_key" in data:
        assert [m["role"] for m in row[data["messages_key"]]] == ["user", "assistant"]
        assert row[data["messages_key"]][1]["content"] == row["extra_info"]["answer"]
    else:
        for key, fields in ((data["prompt_key"], data["prompt_dict_keys"]), (data["response_key"], data["response_dict_keys"])):
            assert all(isinstance(row[key][f], str) and row[key][f] for f in fields)
