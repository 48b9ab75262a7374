"""What verl checks of a composed ``ppo_trainer`` (GRPO) or SFT config when a job starts, checked before it starts.

verl asserts these only after Ray is up and the workers are placed (``validate_config`` in
``verl/utils/config.py``, ``ActorConfig.validate``, the rollout device mesh in
``verl/workers/fsdp_workers.py``), or never notices at all (``trainer.device=cuda`` on an NPU node
just waits for GPU bundles). Checked here on the config verl itself composed (``--cfg job`` in the
image, or Hydra against verl's wheel in the tests), they cost no NPU time. The SFT trainers assert
theirs once every rank is up (``_normalize_config_bsz`` in ``fsdp_sft_trainer``, the engine's batch
split in ``sft_trainer``): checked here on the composed ``sft_trainer`` / ``sft_trainer_engine`` config.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from buildkit.doctor.base import Check
from buildkit.frameworks.verl.releases import needs_device_override, older
from buildkit.matrix.yamlsource import YamlTooLarge, check_yaml_size

_TOP_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*:(\s|$)")


class Unset(Exception):
    """A value the config does not hold as a plain value (absent, or an interpolation)."""


def _get(config: Mapping[str, Any], dotted: str, default: Any = Unset) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            if default is Unset:
                raise Unset(dotted)
            return default
        node = node[part]
    if isinstance(node, str) and node.startswith("${"):
        if default is Unset:
            raise Unset(dotted)
        return default
    return node


def parse_printed_config(stdout: str) -> tuple[dict[str, Any], str] | None:
    """The config Hydra printed for ``--cfg job`` and its text, even when imports printed lines before it."""
    try:
        check_yaml_size(stdout)
    except YamlTooLarge:
        return None
    lines = stdout.splitlines()
    for start, line in enumerate(lines):
        if not _TOP_KEY.match(line):
            continue
        try:
            data = yaml.safe_load("\n".join(lines[start:]))
        except yaml.YAMLError:
            continue
        # verl's configs print a section first and hold trainer and data sections (the SFT config
        # has a few top-level scalars too); a stray "key: value" line printed before is no section
        if (
            isinstance(data, dict)
            and isinstance(next(iter(data.values()), None), dict)
            and isinstance(data.get("trainer"), dict)
            and isinstance(data.get("data"), dict)
        ):
            return data, "\n".join(lines[start:]) + "\n"
    return None


def _device_check(device: str, autodetects: bool, verl: str | None, what: str) -> Check:
    if device == "npu":
        return Check("device", "ok", "trainer.device=npu")
    if autodetects and device == "cuda":
        return Check("device", "ok", f"trainer.device=cuda; verl {verl} switches it to npu when torch_npu loads")
    return Check("device", "error", f"trainer.device={device} and verl {verl or '(unknown release)'} does not switch it to npu: {what}")


def check_sft_config(config: Mapping[str, Any], *, verl: str | None, first_engine: str) -> list[Check]:
    """The SFT trainers' start-up checks (``first_engine``: compat.verl_sft_trainer, from which the
    trainer is sft_trainer and sets trainer.device itself)."""
    try:
        npus = int(_get(config, "trainer.n_gpus_per_node"))
        nodes = int(_get(config, "trainer.nnodes"))
        batch = int(_get(config, "data.train_batch_size"))
        micro = int(_get(config, "data.micro_batch_size_per_gpu"))
        device = str(_get(config, "trainer.device"))
    except (Unset, TypeError, ValueError) as exc:
        return [Check("config values", "error", f"the composed config has no plain value for {exc}")]
    checks = [
        _device_check(
            device, not needs_device_override(verl, first_engine), verl, "its ranks would put the model on a CUDA device that is not there"
        )
    ]
    sp = int(_get(config, "ulysses_sequence_parallel_size", 1) or 1)
    ranks = npus * nodes // sp
    if batch % ranks:
        checks.append(Check("batch split", "error", f"train_batch_size {batch} is not divisible by the {ranks} data-parallel ranks"))
    elif bool(_get(config, "data.use_dynamic_bsz", False)):
        checks.append(Check("batch split", "ok", f"{batch} examples over {ranks} ranks; use_dynamic_bsz: verl sizes the micro-batches"))
    elif (batch // ranks) % micro:
        checks.append(
            Check("batch split", "error", f"{batch // ranks} examples per rank are not a multiple of micro_batch_size_per_gpu {micro}")
        )
    else:
        checks.append(Check("batch split", "ok", f"{batch} examples over {ranks} ranks: {batch // ranks} each, micro-batches of {micro}"))
    rank = int(_get(config, "model.lora_rank", 0) or 0)
    if rank > 0:
        targets = _get(config, "model.target_modules", "all-linear")
        checks.append(Check("LoRA", "ok", f"rank {rank}, alpha {_get(config, 'model.lora_alpha', '?')} on {targets}"))
    else:
        checks.append(Check("LoRA", "warn", "model.lora_rank 0: full fine-tuning, where the seed's SFT job trains LoRA adapters"))
    return checks


# verl's legacy reward keys (its legacy_reward_impl.yaml, from 0.7.1 on) and where verl reads each now, as
# migrate_legacy_reward_impl moves them; a key absent here (reward_model.model.external_lib, trust_remote_code) it
# never moves. From compat.verl_legacy_reward_ignored on, main_ppo no longer calls the migration.
_LEGACY_REWARD_PLACES = {
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.reward_loop_source": "reward.reward_manager.source",
    "reward_model.reward_loop_module_path": "reward.reward_manager.module.path",
    "reward_model.reward_loop_class_name": "reward.reward_manager.module.name",
    "reward_model.model.path": "reward.reward_model.model_path",
}
_LEGACY_REWARD_SECTIONS = {
    "custom_reward_function": "reward.custom_reward_function",
    "sandbox_fusion": "reward.sandbox_fusion",
    "reward_model.rollout": "reward.reward_model.rollout",
    "reward_model.reward_kwargs": "reward.reward_kwargs",
    **{f"reward_model.{k}": f"reward.reward_model.{k}" for k in ("enable", "enable_resource_pool", "n_gpus_per_node", "nnodes")},
}


def _set_leaves(node: Any, prefix: str) -> dict[str, Any]:
    """The dotted keys under ``node`` that hold a value (not null)."""
    if isinstance(node, Mapping):
        found: dict[str, Any] = {}
        for key, value in node.items():
            found.update(_set_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return found
    return {} if node is None else {prefix: node}


def legacy_reward_place(key: str) -> str | None:
    """Where verl reads a legacy reward key now (``reward.…``), or None where no release moves it."""
    if key in _LEGACY_REWARD_PLACES:
        return _LEGACY_REWARD_PLACES[key]
    for old, new in _LEGACY_REWARD_SECTIONS.items():
        if key == old or key.startswith(old + "."):
            return new + key.removeprefix(old)
    return None


def check_reward(config: Mapping[str, Any], *, verl: str | None, legacy_ignored: str) -> Check:
    """Which reward function the job scores with, as the image's verl would pick it; an error where a key the job sets
    is one verl no longer reads (``legacy_ignored``: compat.verl_legacy_reward_ignored), so the job would score with
    verl's default reward, silently."""
    section = config.get("reward")
    # verl before the reward section (0.7.0 and older): the top-level keys are the ones it reads
    custom = config.get("custom_reward_function") or {}
    where, note = "custom_reward_function", ""
    if isinstance(section, Mapping) and isinstance(section.get("custom_reward_function"), Mapping):
        legacy = {
            key: value
            for name in ("custom_reward_function", "reward_model", "sandbox_fusion")
            for key, value in _set_leaves(config.get(name), name).items()
        }
        custom = dict(section["custom_reward_function"])
        where = "reward.custom_reward_function"
        if legacy:
            moved = ", ".join(f"{key} -> {legacy_reward_place(key) or '(read nowhere)'}" for key in legacy)
            if verl is None:
                return Check(
                    "reward function",
                    "warn",
                    f"the job sets verl's legacy reward keys, which verl reads only where its main_ppo moves them (releases "
                    f"before {legacy_ignored}); this verl's release is unknown: set them where verl reads them now: {moved}",
                )
            if not older(verl, legacy_ignored):
                return Check(
                    "reward function",
                    "error",
                    f"verl {verl} never reads the legacy reward keys the job sets (its main_ppo stopped moving them under "
                    f"reward: in {legacy_ignored}), so the job would run as if they were not there (with verl's default "
                    f"reward); set them where verl reads them: {moved}",
                )
            # main_ppo replaces the whole section with the legacy one, its nulls included
            if _set_leaves(config.get("custom_reward_function"), ""):
                custom = dict(config.get("custom_reward_function") or {})
                where, note = "custom_reward_function", f", which verl {verl}'s main_ppo moves into the reward section"
    path, name = custom.get("path"), custom.get("name")
    if not path:
        return Check("reward function", "ok", "none set: verl scores each sample with its default_compute_score, by data_source")
    if not name:
        return Check(
            "reward function",
            "error",
            f"{where}.path is {path} and {where}.name is null{note}; verl asserts a name when it loads the function",
        )
    return Check("reward function", "ok", f"{name} from {path} ({where}{note})")


def check_config(config: Mapping[str, Any], *, verl: str | None, first_autodetect: str, legacy_reward_ignored: str) -> list[Check]:
    """The start-up checks, each named for what verl would have done with the config."""
    checks: list[Check] = []
    try:
        npus = int(_get(config, "trainer.n_gpus_per_node"))
        nodes = int(_get(config, "trainer.nnodes"))
        batch = int(_get(config, "data.train_batch_size"))
        n = int(_get(config, "actor_rollout_ref.rollout.n"))
        mini = int(_get(config, "actor_rollout_ref.actor.ppo_mini_batch_size"))
        tp = int(_get(config, "actor_rollout_ref.rollout.tensor_model_parallel_size"))
        device = str(_get(config, "trainer.device"))
    except (Unset, TypeError, ValueError) as exc:
        return [Check("config values", "error", f"the composed config has no plain value for {exc}")]
    world = npus * nodes
    checks.append(
        _device_check(
            device,
            not needs_device_override(verl, first_autodetect),
            verl,
            "its worker groups would ask Ray for GPU bundles an Ascend node never has, and the job would wait until the timeout",
        )
    )

    dynamic = bool(_get(config, "actor_rollout_ref.actor.use_dynamic_bsz", False))
    strategy = str(_get(config, "actor_rollout_ref.actor.strategy", "fsdp"))
    if dynamic:
        checks.append(Check("batch split", "ok", "use_dynamic_bsz: verl sizes the micro-batches itself"))
    elif strategy not in ("fsdp", "fsdp2"):
        checks.append(Check("batch split", "warn", f"actor strategy {strategy}: only FSDP batch splits are checked here"))
    else:
        real = batch * n
        checks.append(
            Check(
                "batch split",
                "ok" if real % world == 0 else "error",
                f"train_batch_size {batch} x rollout.n {n} = {real} over {world} data-parallel ranks",
            )
        )
        problems = []
        if batch < mini:
            problems.append(f"train_batch_size {batch} < ppo_mini_batch_size {mini}")
        per_rank = mini * n // world
        if per_rank <= 0:
            problems.append(f"ppo_mini_batch_size {mini} x rollout.n {n} gives no sample per rank of {world}")
        micro = _get(config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", None)
        if micro is not None and per_rank > 0 and per_rank % int(micro):
            problems.append(f"the per-rank mini-batch {per_rank} is not a multiple of ppo_micro_batch_size_per_gpu {micro}")
        detail = f"ppo_mini_batch_size {mini} x rollout.n {n} / {world} ranks = {per_rank} per rank"
        checks.append(Check("mini-batches", "error" if problems else "ok", "; ".join(problems) or detail))

    dp = int(_get(config, "actor_rollout_ref.rollout.data_parallel_size", 1) or 1)
    pp = int(_get(config, "actor_rollout_ref.rollout.pipeline_model_parallel_size", 1) or 1)
    group = tp * dp * pp
    tp_problems = []
    if npus % tp:
        tp_problems.append(f"rollout tensor_model_parallel_size {tp} does not divide the {npus} NPUs of a node")
    if world % group:
        tp_problems.append(f"the rollout group of {group} NPUs does not divide the {world} NPUs of the job")
    checks.append(
        Check(
            "rollout parallelism",
            "error" if tp_problems else "ok",
            "; ".join(tp_problems) or f"tensor parallel {tp} x {world // group} rollout replicas on {world} NPUs",
        )
    )
    checks.append(check_reward(config, verl=verl, legacy_ignored=legacy_reward_ignored))
    return checks
