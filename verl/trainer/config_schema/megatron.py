"""Checks of a PPO config that selects the Megatron engine, run by the config validator before any worker
starts; every failure is a ``ConfigError`` naming the key and what would work. Nothing here imports megatron-core:
the settings the engine refuses come from ``verl.models.mcore.settings``."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from operator import attrgetter

from verl.models.mcore.lora import check_lora_settings
from verl.models.mcore.router_replay import check_router_replay
from verl.models.mcore.settings import (MEGATRON_DTYPES, check_megatron_settings, optimizer_overrides,
                                       transformer_overrides)
from verl.trainer.config_schema.ppo import PPOTrainerConfig, as_ppo_config
from verl.utils.config import ConfigError
from verl.utils.device import get_device_name

__all__ = ["check_megatron_config", "MEGATRON_DEFAULTS"]

AR = "actor_rollout_ref"
MEGATRON_DEFAULTS = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                     "virtual_pipeline_model_parallel_size": None, "context_parallel_size": 1,
                     "expert_model_parallel_size": 1}


def _section_dict(section) -> dict:
    """A typed ``megatron`` / ``override_*`` section as the plain mapping the settings checks take (a section
    written as null: empty)."""
    if section is None:
        return {}
    if dataclasses.is_dataclass(section):
        return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
    return dict(section)


def _sizes(meg: dict) -> tuple[int, int]:
    return int(meg.get("tensor_model_parallel_size") or 1), int(meg.get("pipeline_model_parallel_size") or 1)


def _expert_sizes(meg: dict) -> tuple[int, int]:
    """(expert_model_parallel_size, expert_tensor_parallel_size; megatron's default for the latter: the TP size)."""
    tp = _sizes(meg)[0]
    return int(meg.get("expert_model_parallel_size") or 1), int(meg.get("expert_tensor_parallel_size") or tp)


def _hf_config(path: str, trust: bool):
    from transformers import AutoConfig  # here: the driver validates configs without loading transformers

    return AutoConfig.from_pretrained(os.path.expanduser(path), trust_remote_code=trust)


def check_megatron_config(config, check_files: bool = True, typed: PPOTrainerConfig | None = None) -> None:
    """Megatron keys only with strategy=megatron; sizes that divide the processes, heads and layers; a
    supported architecture; one parallel grid per worker group; LoRA through ``model.lora`` (not the FSDP engine's
    ``model.lora_rank``); a Megatron reward model's own sizes; a dist-checkpoint start's directory. ``typed``: the config's typed view, when the caller has built it."""
    typed = as_ppo_config(config, typed)
    ar = typed.actor_rollout_ref
    _check_router_replay(typed, check_files)
    lora_rank = int(getattr(ar.model.lora, "rank", 0) or 0)
    if lora_rank > 0 and ar.actor.strategy != "megatron":
        raise ConfigError(f"{AR}.model.lora.rank={lora_rank}: model.lora.* is the Megatron engine's LoRA, but "
                          f"{AR}.actor.strategy={ar.actor.strategy!r}; with fsdp set model.lora_rank / lora_alpha / "
                          "target_modules (and leave model.lora.rank=0), or set actor.strategy=megatron")
    roles = [(f"{AR}.actor", ar.actor, f"{AR}.model.path"), (f"{AR}.ref", ar.ref, f"{AR}.model.path"),
             ("critic", typed.critic, "critic.model.path")]
    actor_megatron = ar.actor.strategy == "megatron"
    for prefix, role, path_key in roles:
        strategy = role.strategy
        meg = _section_dict(role.megatron)
        if strategy != "megatron":
            for k, default in MEGATRON_DEFAULTS.items():
                if k in meg and meg[k] != default:
                    raise ConfigError(f"{prefix}.megatron.{k}={meg[k]!r} applies to strategy=megatron only, but "
                                      f"{prefix}.strategy={strategy!r}; set {prefix}.strategy=megatron or remove "
                                      "the megatron keys")
            continue
        if prefix == "critic" and not _critic_used(typed):
            continue
        if prefix == f"{AR}.ref" and not _ref_used(typed):
            continue
        if not actor_megatron:
            raise ConfigError(f"{prefix}.strategy=megatron needs {AR}.actor.strategy=megatron too (the worker "
                              "classes follow the actor's strategy); use the same strategy for both")
        if importlib.util.find_spec("megatron") is None:
            raise ConfigError(f"{prefix}.strategy=megatron needs megatron-core, which is not installed: "
                              f"`pip install .[mcore]` (or megatron-core 0.16), or set {prefix}.strategy=fsdp")
        if prefix == f"{AR}.actor":
            _check_lora(ar.model)
        shared = typed.critic.model.share_prompt_prefix if prefix == "critic" else ar.model.share_prompt_prefix
        if shared is True:
            owner = "critic.model" if prefix == "critic" else f"{AR}.model"
            raise ConfigError(f"{owner}.share_prompt_prefix=true is not available with strategy=megatron (the "
                              "packed prompt rows are an FSDP engine path); set it to false")
        on_cpu = get_device_name() == "cpu"
        try:
            transformer_overrides(meg, f"{prefix}.megatron", on_cpu)
            optim = getattr(role, "optim", None)  # the reference has no optimizer
            if optim is not None:
                optimizer_overrides(_section_dict(optim.override_optimizer_config),
                                    f"{prefix}.optim.override_optimizer_config", on_cpu)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        _check_dist_checkpoint(meg, f"{prefix}.megatron", check_files)
        tp, pp = _sizes(meg)
        n_procs = int(typed.trainer.n_gpus_per_node) * int(typed.trainer.nnodes)
        if n_procs % (tp * pp):
            raise ConfigError(f"{prefix}.megatron: tensor_model_parallel_size * pipeline_model_parallel_size = "
                              f"{tp} * {pp} must divide trainer.n_gpus_per_node * trainer.nnodes = {n_procs}")
        ep, etp = _expert_sizes(meg)
        if n_procs % (etp * ep * pp):
            raise ConfigError(f"{prefix}.megatron: expert_tensor_parallel_size * expert_model_parallel_size * "
                              f"pipeline_model_parallel_size = {etp} * {ep} * {pp} must divide "
                              f"trainer.n_gpus_per_node * trainer.nnodes = {n_procs}")
        path = attrgetter(path_key)(typed)
        if check_files and path and os.path.isfile(os.path.join(os.path.expanduser(str(path)), "config.json")):
            trust = bool(ar.model.trust_remote_code)
            try:
                hf_config = _hf_config(str(path), trust)
                check_megatron_settings(meg, hf_config, f"{prefix}.megatron", on_cpu=on_cpu)
                if prefix == f"{AR}.actor":  # LoRA on the layers the model has (experts' dropout needs ETP=1)
                    check_lora_settings(ar.model.lora, hf_config, f"{AR}.model.lora", megatron=meg)
            except ValueError as e:
                raise ConfigError(f"{e} (model {path_key}={path})") from None
    if actor_megatron and _ref_used(typed) and ar.ref.strategy == "megatron":
        _check_same_grid(typed, f"{AR}.ref", ar.ref.megatron, "the reference shares the actor's processes")
    if actor_megatron and _critic_used(typed) and typed.critic.strategy == "megatron":
        _check_same_grid(typed, "critic", typed.critic.megatron,
                         "the critic is built in the actor's processes (one Megatron grid per process)")
    if typed.reward_model.enable and typed.reward_model.strategy == "megatron":
        _check_megatron_reward_model(typed, check_files)


def _grid(meg) -> tuple[int, int, int, int]:
    meg = _section_dict(meg)
    return _sizes(meg) + _expert_sizes(meg)


def _check_same_grid(typed: PPOTrainerConfig, prefix: str, meg, why: str, fix: str = "") -> None:
    """A Megatron role that shares the actor's processes must use the actor's (tp, pp, ep, etp): megatron-core
    holds one parallel grid per process."""
    a, r = _grid(typed.actor_rollout_ref.actor.megatron), _grid(meg)
    if a != r:
        names = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
                 "expert_tensor_parallel_size")
        wanted = " ".join(f"{prefix}.megatron.{n}={v}" for n, v, mine in zip(names, a, r) if v != mine)
        raise ConfigError(f"{prefix}.megatron (tp, pp, ep, etp) = {r} differs from {AR}.actor.megatron {a}: {why}; "
                          f"use the same sizes ({wanted}){fix}")


def _check_router_replay(typed: PPOTrainerConfig, check_files: bool) -> None:
    """``actor.router_replay.mode=R2``: the Megatron engine, a mixture-of-experts model, and an old-log-prob pass
    whose routing the update can replay (see ``verl.models.mcore.router_replay``)."""
    ar = typed.actor_rollout_ref
    mode = ar.actor.router_replay.mode
    if mode == "disabled":
        return
    key = f"{AR}.actor.router_replay.mode"
    try:  # the mode and the engine first; the model's layers below
        check_router_replay(mode, None, key, strategy=ar.actor.strategy)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if ar.actor.old_log_prob_source != "update" and typed.algorithm.rollout_correction.bypass_mode:
        raise ConfigError(f"{key}={mode} replays the experts of the trainer's old-log-prob pass, which "
                          "algorithm.rollout_correction.bypass_mode=True skips (old_log_probs come from the rollout); "
                          f"set bypass_mode=false or {key}=disabled")
    path = ar.model.path
    if check_files and path and os.path.isfile(os.path.join(os.path.expanduser(str(path)), "config.json")):
        try:
            check_router_replay(mode, _hf_config(str(path), bool(ar.model.trust_remote_code)), key,
                                strategy=ar.actor.strategy)
        except ValueError as e:
            raise ConfigError(f"{e} (model {AR}.model.path={path})") from None


def _check_megatron_reward_model(typed: PPOTrainerConfig, check_files: bool) -> None:
    """``reward_model.strategy=megatron``: the sequence classifier on the Megatron engine, in the Megatron workers
    (which follow the actor's strategy), its ``reward_model.megatron`` sizes dividing its processes."""
    rm, prefix = typed.reward_model, "reward_model"
    if typed.actor_rollout_ref.actor.strategy != "megatron":
        raise ConfigError(f"{prefix}.strategy=megatron needs {AR}.actor.strategy=megatron too (the worker classes "
                          f"follow the actor's strategy); set {prefix}.strategy=fsdp")
    if importlib.util.find_spec("megatron") is None:
        raise ConfigError(f"{prefix}.strategy=megatron needs megatron-core, which is not installed: "
                          f"`pip install .[mcore]` (or megatron-core 0.16), or set {prefix}.strategy=fsdp")
    meg = _section_dict(rm.megatron)
    on_cpu = get_device_name() == "cpu"
    try:
        transformer_overrides(meg, f"{prefix}.megatron", on_cpu)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _check_dist_checkpoint(meg, f"{prefix}.megatron", check_files)
    if not rm.enable_resource_pool:
        _check_same_grid(typed, prefix, rm.megatron, "the reward model is built in the actor's processes (one "
                         "Megatron grid per process)", ", or give it processes of its own with "
                         "reward_model.enable_resource_pool=True")
    tp, pp = _sizes(meg)
    pool = typed.reward_model if rm.enable_resource_pool else typed.trainer
    n_procs = int(pool.n_gpus_per_node) * int(pool.nnodes)
    if n_procs % (tp * pp):
        raise ConfigError(f"{prefix}.megatron: tensor_model_parallel_size * pipeline_model_parallel_size = {tp} * {pp} "
                          f"must divide the reward model's {n_procs} processes")
    path = rm.model.path
    if check_files and path and os.path.isfile(os.path.join(os.path.expanduser(str(path)), "config.json")):
        hf = _hf_config(str(path), bool(rm.model.trust_remote_code))
        try:
            check_megatron_settings(meg, hf, f"{prefix}.megatron", on_cpu=on_cpu)
        except ValueError as e:
            raise ConfigError(f"{e} (model {prefix}.model.path={path})") from None


def _check_lora(model) -> None:
    """``model.lora`` with strategy=megatron: a rank given once (``model.lora_rank`` is the FSDP engine's key), and
    values the Megatron engine builds (``verl.models.mcore.lora.check_lora_settings``)."""
    rank = int(getattr(model.lora, "rank", 0) or 0)
    if rank == 0 and int(model.lora_rank or 0) > 0:
        raise ConfigError(f"{AR}.model.lora_rank={model.lora_rank} is the FSDP engine's LoRA key; with "
                          f"strategy=megatron set {AR}.model.lora.rank (and lora.alpha, lora.target_modules ...)")
    if rank > 0 and int(model.lora_rank or 0) != rank:
        raise ConfigError(f"{AR}.model.lora_rank={model.lora_rank} and {AR}.model.lora.rank={rank} disagree; with "
                          "strategy=megatron set only model.lora.rank")
    if model.lora_adapter_path and rank > 0:
        raise ConfigError(f"{AR}.model.lora_adapter_path (a PEFT adapter) is not read by the Megatron engine; "
                          "leave it null with model.lora.rank > 0")
    try:
        check_lora_settings(model.lora, None, f"{AR}.model.lora", MEGATRON_DTYPES)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_dist_checkpoint(meg: dict, prefix: str, check_files: bool) -> None:
    """``use_dist_checkpointing=True`` needs ``dist_checkpointing_path``: a Megatron distributed checkpoint."""
    if not meg.get("use_dist_checkpointing"):
        return
    path = meg.get("dist_checkpointing_path")
    make = ("`python -m verl.models.mcore.converter_hf_to_mcore --hf_model_path <hf dir> --output_path <dir>` writes "
            "one from HF weights")
    if not path:
        raise ConfigError(f"{prefix}.use_dist_checkpointing=True needs {prefix}.dist_checkpointing_path, the directory "
                          f"of a Megatron distributed checkpoint ({make}); or set {prefix}.use_dist_checkpointing="
                          "False to start from model.path's HF weights")
    if check_files and not os.path.isfile(os.path.join(os.path.expanduser(str(path)), "metadata.json")):
        raise ConfigError(f"{prefix}.dist_checkpointing_path={path!r} is not a Megatron distributed checkpoint (no "
                          f"metadata.json there); {make}")


def _critic_used(typed: PPOTrainerConfig) -> bool:
    enable = typed.critic.enable
    return bool(enable) if enable is not None else typed.algorithm.adv_estimator == "gae"


def _ref_used(typed: PPOTrainerConfig) -> bool:
    return bool(typed.algorithm.use_kl_in_reward or typed.actor_rollout_ref.actor.use_kl_loss)
