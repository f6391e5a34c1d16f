"""Per-rank batch sizes, derived once from a role's config section (verl's normalisation rules).

verl's batch keys are *global* on the driver and *per device* inside a worker:

* ``ppo_mini_batch_size`` counts prompts; one rank sees ``ppo_mini_batch_size * rollout_n / dp_size``
  responses per optimizer step;
* the deprecated global ``ppo_micro_batch_size`` / ``log_prob_micro_batch_size`` / ``forward_micro_batch_size`` /
  ``micro_batch_size`` are divided by ``dp_size`` and replace the matching ``*_per_gpu`` key (as verl's workers
  do); "per gpu" means per device, and one CPU worker process counts as one device.

:func:`normalized_batch_sizes` is a pure function of (section, rollout_n, dp_size): the driver calls it to validate
before any worker starts, and a worker calls it instead of rewriting its own config. Errors are
:class:`~verl.utils.config.ConfigError` naming the key and what would divide.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

from verl.utils.config import ConfigError

__all__ = ["NormalizedBatchSizes", "normalized_batch_sizes", "per_rank_size"]


@dataclass(frozen=True)
class NormalizedBatchSizes:
    """Sizes one data-parallel rank works with (``None``: the section has no such key)."""

    dp_size: int
    rollout_n: int
    use_dynamic_bsz: bool
    ppo_mini_batch_size: Optional[int]  # responses per rank per optimizer step
    ppo_micro_batch_size_per_gpu: Optional[int]  # responses per forward/backward
    gradient_accumulation_steps: Optional[int]  # micro-batches per optimizer step (fixed micro size only)
    log_prob_micro_batch_size_per_gpu: Optional[int]  # actor/rollout/ref log-prob passes
    forward_micro_batch_size_per_gpu: Optional[int]  # critic value pass (defaults to the ppo micro size)
    micro_batch_size_per_gpu: Optional[int]  # reward model scoring


def _as_section(section: Any) -> Any:
    """``section`` with its keys as attributes: a typed section or DictConfig as given, a plain dict wrapped."""
    return SimpleNamespace(**section) if isinstance(section, dict) else section


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}={value!r} must be an integer >= 1")
    if value < 1:
        raise ConfigError(f"{key}={value!r} must be an integer >= 1")
    return value


def per_rank_size(section: Any, global_key: str, per_gpu_key: str, dp_size: int, prefix: str) -> Optional[int]:
    """``<global_key> // dp_size`` when the deprecated global key is set (it wins, as in verl), else the per-gpu key.
    A key the role's section does not have counts as unset (each role carries only its own batch keys)."""
    section = _as_section(section)
    global_value = getattr(section, global_key, None)
    if global_value is not None:
        global_value = _positive_int(global_value, f"{prefix}{global_key}")
        if global_value % dp_size != 0:
            raise ConfigError(f"{prefix}{global_key}={global_value} must split evenly over {dp_size} data-parallel "
                              f"ranks; use {prefix}{per_gpu_key} (per device) instead")
        return global_value // dp_size
    value = getattr(section, per_gpu_key, None)
    return None if value is None else _positive_int(value, f"{prefix}{per_gpu_key}")


def normalized_batch_sizes(section: Any, rollout_n: int, dp_size: int, prefix: str = "",
                           use_dynamic_bsz: Optional[bool] = None) -> NormalizedBatchSizes:
    """Per-rank sizes of one role.

    ``section`` is a role's config (``actor_rollout_ref.actor`` / ``.ref`` / ``.rollout``, ``critic`` or
    ``reward_model``) as a DictConfig, dict or typed section; ``prefix`` (e.g. ``"critic."``) is prepended to key
    names in error messages. Without ``use_dynamic_bsz`` every fixed micro size must divide the per-rank mini batch.
    """
    if dp_size < 1:
        raise ValueError(f"dp_size={dp_size} must be >= 1")
    rollout_n = _positive_int(rollout_n, "actor_rollout_ref.rollout.n")
    # each role's section carries only its own batch keys (the rollout has no ppo_*, the actor no forward_*, ...):
    # a key the section does not have reads as None, "not this role's"
    section = _as_section(section)
    if use_dynamic_bsz is None:
        use_dynamic_bsz = getattr(section, "use_dynamic_bsz", None)
    dynamic = bool(use_dynamic_bsz)

    mini = getattr(section, "ppo_mini_batch_size", None)
    per_rank_mini = micro = accum = None
    if mini is not None:
        mini = _positive_int(mini, f"{prefix}ppo_mini_batch_size")
        if (mini * rollout_n) % dp_size != 0:
            raise ConfigError(f"{prefix}ppo_mini_batch_size * rollout.n (= {mini} * {rollout_n}) must split evenly "
                              f"over {dp_size} data-parallel ranks. Change {prefix}ppo_mini_batch_size or the number "
                              "of ranks (trainer.n_gpus_per_node).")
        per_rank_mini = mini * rollout_n // dp_size
        micro = per_rank_size(section, "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", dp_size, prefix)
        if not dynamic:
            if micro is None:
                raise ConfigError(f"set '{prefix}ppo_micro_batch_size_per_gpu' (micro batch per device/process), or "
                                  f"'{prefix}use_dynamic_bsz=True' with a token budget")
            if per_rank_mini % micro != 0:
                divisors = [d for d in range(1, per_rank_mini + 1) if per_rank_mini % d == 0]
                raise ConfigError(
                    f"the per-rank mini batch ({prefix}ppo_mini_batch_size * rollout.n / ranks = {mini} * {rollout_n} "
                    f"/ {dp_size} = {per_rank_mini}) must be a multiple of {prefix}ppo_micro_batch_size_per_gpu="
                    f"{micro}. Choose {prefix}ppo_micro_batch_size_per_gpu among the divisors of {per_rank_mini}: "
                    f"{divisors}")
            accum = per_rank_mini // micro

    log_prob = per_rank_size(section, "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", dp_size, prefix)
    forward = per_rank_size(section, "forward_micro_batch_size", "forward_micro_batch_size_per_gpu", dp_size, prefix)
    if forward is None and micro is not None and getattr(section, "forward_max_token_len_per_gpu", None) is not None:
        forward = micro  # the critic's value pass defaults to its training micro size
    rm_micro = per_rank_size(section, "micro_batch_size", "micro_batch_size_per_gpu", dp_size, prefix)
    return NormalizedBatchSizes(dp_size=dp_size, rollout_n=rollout_n, use_dynamic_bsz=dynamic,
                                ppo_mini_batch_size=per_rank_mini, ppo_micro_batch_size_per_gpu=micro,
                                gradient_accumulation_steps=accum, log_prob_micro_batch_size_per_gpu=log_prob,
                                forward_micro_batch_size_per_gpu=forward, micro_batch_size_per_gpu=rm_micro)
