"""The start-up checks on a composed verl config, and reading the config Hydra printed."""

from __future__ import annotations

from typing import Any

from buildkit.frameworks.verl.config import check_config, check_sft_config, parse_printed_config


def _config(**trainer: Any) -> dict[str, Any]:
    return {
        "data": {"train_batch_size": 32},
        "actor_rollout_ref": {
            "actor": {"ppo_mini_batch_size": 32, "ppo_micro_batch_size_per_gpu": 2, "strategy": "fsdp", "use_dynamic_bsz": False},
            "rollout": {"n": 2, "tensor_model_parallel_size": 2},
        },
        "trainer": {"n_gpus_per_node": 16, "nnodes": 1, "device": "npu", **trainer},
    }


def _status(config: dict[str, Any], verl: str | None = "0.6.1") -> dict[str, str]:
    return {c.name: c.status for c in check_config(config, verl=verl, first_autodetect="0.7.0", legacy_reward_ignored="0.9.0")}


def test_the_smoke_shape_passes() -> None:
    assert set(_status(_config()).values()) == {"ok"}


def test_cuda_is_an_error_only_for_a_verl_that_does_not_switch_it() -> None:
    assert _status(_config(device="cuda"), "0.6.1")["device"] == "error"
    assert _status(_config(device="cuda"), "0.9.1")["device"] == "ok"
    assert _status(_config(device="cuda"), None)["device"] == "error"


def test_verls_batch_and_parallelism_assertions() -> None:
    config = _config(n_gpus_per_node=16)
    config["data"]["train_batch_size"] = 12  # 12 x 2 = 24 rollouts over 16 ranks
    assert _status(config)["batch split"] == "error"
    config = _config()
    config["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] = 3  # 32 x 2 / 16 = 4 per rank
    assert _status(config)["mini-batches"] == "error"
    config = _config()
    config["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] = 3
    assert _status(config)["rollout parallelism"] == "error"
    config = _config()
    config["data"]["train_batch_size"] = "${oc.env:BATCH}"
    assert [c.detail for c in check_config(config, verl="0.6.1", first_autodetect="0.7.0", legacy_reward_ignored="0.9.0")] == [
        "the composed config has no plain value for data.train_batch_size"
    ]


def test_the_printed_config_is_found_after_import_noise() -> None:
    stdout = "INFO 11-22 import noise: something\nwarning: x\ndata:\n  train_batch_size: 32\ntrainer:\n  device: npu\n"
    parsed = parse_printed_config(stdout)
    assert parsed is not None
    config, text = parsed
    assert config["trainer"]["device"] == "npu" and text.startswith("data:\n")
    assert parse_printed_config("Traceback (most recent call last):\nImportError: x\n") is None


def _sft(**trainer: Any) -> dict[str, Any]:
    return {
        "data": {"train_batch_size": 64, "micro_batch_size_per_gpu": 4},
        "model": {"lora_rank": 32, "lora_alpha": 16, "target_modules": "all-linear"},
        "trainer": {"n_gpus_per_node": 16, "nnodes": 1, "device": "npu", **trainer},
    }


def _sft_status(config: dict[str, Any], verl: str | None = "0.6.1") -> dict[str, str]:
    return {c.name: c.status for c in check_sft_config(config, verl=verl, first_engine="0.7.1")}


def test_the_sft_smoke_shape_passes() -> None:
    assert _sft_status(_sft()) == {"device": "ok", "batch split": "ok", "LoRA": "ok"}


def test_sft_device_batch_and_lora_are_judged_as_the_trainers_would() -> None:
    assert _sft_status(_sft(device="cuda"), "0.6.1")["device"] == "error", "fsdp_sft_trainer puts tensors on trainer.device"
    assert _sft_status(_sft(device="cuda"), "0.7.1")["device"] == "ok", "sft_trainer's main sets it"
    config = _sft()
    config["data"]["train_batch_size"] = 40  # 40 over 16 ranks: fsdp_sft_trainer's assertion
    assert _sft_status(config)["batch split"] == "error"
    config = _sft()
    config["data"]["micro_batch_size_per_gpu"] = 3  # 4 per rank, not a multiple of 3
    assert _sft_status(config)["batch split"] == "error"
    config["data"]["use_dynamic_bsz"] = True
    assert _sft_status(config)["batch split"] == "ok"
    config = _sft()
    config["model"]["lora_rank"] = 0
    assert _sft_status(config)["LoRA"] == "warn"
    config = _sft()
    config["ulysses_sequence_parallel_size"] = 2  # 8 data-parallel ranks of 2
    assert [c.detail for c in check_sft_config(config, verl="0.6.1", first_engine="0.7.1") if c.name == "batch split"] == [
        "64 examples over 8 ranks: 8 each, micro-batches of 4"
    ]


def test_the_sft_config_is_found_after_import_noise() -> None:
    """fsdp_sft_trainer's config has top-level scalars (use_remove_padding) beside its sections."""
    stdout = "warning: x\ndata:\n  train_batch_size: 64\nuse_remove_padding: false\ntrainer:\n  device: npu\n"
    parsed = parse_printed_config(stdout)
    assert parsed is not None and parsed[0]["use_remove_padding"] is False and parsed[1].startswith("data:\n")


# ---- the reward function: which one the job scores with, and the keys a verl no longer reads ------------------------


def _reward(config: dict[str, Any], verl: str | None) -> tuple[str, str]:
    (check,) = [
        c for c in check_config(config, verl=verl, first_autodetect="0.7.0", legacy_reward_ignored="0.9.0") if c.name == "reward function"
    ]
    return check.status, check.detail


def _layered(legacy: dict[str, Any] | None = None, new: dict[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    """A config of verl 0.7.1 on: the reward section, and the legacy keys beside it (null unless set)."""
    config = _config()
    config["reward"] = {"custom_reward_function": {"path": None, "name": "compute_score", **(new or {})}, "reward_model": {"enable": False}}
    config["custom_reward_function"] = {"path": None, "name": None, **(legacy or {})}
    config["reward_model"] = {"enable": None, "model": {"path": None}, "rollout": {"name": None}}
    config["sandbox_fusion"] = {"url": None}
    for name, value in sections.items():
        config[name] = value
    return config


def test_no_reward_function_set_scores_with_verls_default() -> None:
    assert _reward(_config(), "0.6.1") == ("ok", "none set: verl scores each sample with its default_compute_score, by data_source")
    assert _reward(_layered(), "0.9.1")[0] == "ok"


def test_the_reward_key_verl_reads_is_named_with_its_function() -> None:
    assert _reward(_layered(new={"path": "/opt/team/rewards/math.py"}), "0.9.1") == (
        "ok",
        "compute_score from /opt/team/rewards/math.py (reward.custom_reward_function)",
    )
    old = _config()
    old["custom_reward_function"] = {"path": "/r.py", "name": "score"}  # verl 0.7.0 and older: the top-level key is the one
    assert _reward(old, "0.6.1") == ("ok", "score from /r.py (custom_reward_function)")


def test_a_legacy_reward_key_is_refused_where_verl_no_longer_moves_it() -> None:
    config = _layered(legacy={"path": "/opt/team/rewards/math.py", "name": "compute_score"})
    status, detail = _reward(config, "0.9.1")
    assert status == "error"
    assert "verl 0.9.1 never reads the legacy reward keys" in detail and "in 0.9.0" in detail
    assert "custom_reward_function.path -> reward.custom_reward_function.path" in detail
    assert "custom_reward_function.name -> reward.custom_reward_function.name" in detail
    # where main_ppo still moves it, the job scores with it
    assert _reward(config, "0.8.0") == (
        "ok",
        "compute_score from /opt/team/rewards/math.py (custom_reward_function, which verl 0.8.0's main_ppo moves into the reward section)",
    )
    # a fork of unknown release: said, not refused
    status, detail = _reward(config, None)
    assert status == "warn" and "custom_reward_function.path -> reward.custom_reward_function.path" in detail


def test_every_legacy_reward_section_is_named_with_where_verl_reads_it() -> None:
    config = _layered(
        reward_model={
            "enable": True,
            "reward_manager": "dapo",
            "model": {"path": "/rm", "external_lib": "x"},
            "rollout": {"name": "vllm"},
            "reward_kwargs": {"overlong_buffer_cfg": {"len": 512}},
        },
        sandbox_fusion={"url": "http://sandbox:8080"},
    )
    status, detail = _reward(config, "0.9.1")
    assert status == "error"
    for moved in (
        "reward_model.enable -> reward.reward_model.enable",
        "reward_model.reward_manager -> reward.reward_manager.name",
        "reward_model.model.path -> reward.reward_model.model_path",
        "reward_model.model.external_lib -> (read nowhere)",
        "reward_model.rollout.name -> reward.reward_model.rollout.name",
        "reward_model.reward_kwargs.overlong_buffer_cfg.len -> reward.reward_kwargs.overlong_buffer_cfg.len",
        "sandbox_fusion.url -> reward.sandbox_fusion.url",
    ):
        assert moved in detail, moved


def test_a_legacy_path_without_a_name_fails_where_main_ppo_moves_the_whole_section() -> None:
    """verl 0.7.1-0.8.x's migration copies the legacy section, its null name included, over reward's (whose name
    defaults to compute_score): get_custom_reward_fn then asserts a name."""
    config = _layered(legacy={"path": "/r.py"})
    status, detail = _reward(config, "0.8.0")
    assert (status, detail) == (
        "error",
        "custom_reward_function.path is /r.py and custom_reward_function.name is null, which verl 0.8.0's main_ppo moves into "
        "the reward section; verl asserts a name when it loads the function",
    )
