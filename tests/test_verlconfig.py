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
    return {c.name: c.status for c in check_config(config, verl=verl, first_autodetect="0.7.0")}


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
    assert [c.detail for c in check_config(config, verl="0.6.1", first_autodetect="0.7.0")] == [
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
