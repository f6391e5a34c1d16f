"""Worker-side config handling: batch-size normalisation (verl's rules) and small shared helpers.

verl's batch-size keys are *global* on the driver side and *per device* inside a worker:

* ``ppo_mini_batch_size`` counts prompts; a worker sees ``ppo_mini_batch_size * rollout.n / dp_size``
  responses per mini-batch;
* the deprecated global ``ppo_micro_batch_size`` / ``log_prob_micro_batch_size`` are divided by ``dp_size`` and
  become the ``*_per_gpu`` keys ("per gpu" = per device; one CPU process counts as one device).

Every failure names the key and says what would divide. The functions only read the config: the derived
sizes are returned as a frozen record, computed once when a worker starts.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Any

import psutil
from omegaconf import DictConfig, OmegaConf

from verl.utils.device import get_device_name, max_memory_allocated_gb


__all__ = ["read_only_config", "PPOBatchSizes", "ppo_batch_sizes", "per_device_micro_size", "log_prob_micro_size", "memory_metrics"]


def read_only_config(config: Any) -> DictConfig:
    """A worker's private, resolved, read-only copy of its config section.

    Resolved: a section keeps interpolations into the whole tree (``${oc.select:actor_rollout_ref.rollout.n,1}``),
    which a detached copy could no longer follow. Read-only: a worker derives what it needs once and never
    writes back (an attempt raises), so colocated roles that share one config object cannot leak into each other.
    """
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=True)
    node = OmegaConf.create(config if config is not None else {})
    OmegaConf.set_readonly(node, True)
    return node


@dataclass(frozen=True)
class PPOBatchSizes:
    """Per-device sizes of one PPO update, derived once from the global keys (see module docstring)."""

    mini_batch_size: int  # responses per device per mini-batch (one optimizer step)
    micro_batch_size: int | None  # responses per forward/backward; None with a token budget (dynamic bsz)


def _divide(value: int, dp_size: int, key: str, what: str) -> int:
    if value % dp_size != 0:
        raise ValueError(f"{key}: {what} = {value} is not divisible by the data-parallel size {dp_size} "
                         f"(the number of worker processes in this group); pick a multiple of {dp_size}")
    result = value // dp_size
    if result <= 0:
        raise ValueError(f"{key}: {what} = {value} gives {result} per device with {dp_size} devices; it must be "
                         f">= {dp_size}")
    return result


def per_device_micro_size(cfg: Any, global_key: str, per_gpu_key: str, dp_size: int, prefix: str) -> int | None:
    """``cfg.<per_gpu_key>``, or the deprecated global ``cfg.<global_key>`` divided by ``dp_size``."""
    global_value = cfg.get(global_key)
    per_gpu = cfg.get(per_gpu_key)
    if global_value is None:
        return None if per_gpu is None else int(per_gpu)
    derived = _divide(int(global_value), dp_size, f"{prefix}.{global_key}", global_key)
    if per_gpu not in (None, derived):
        raise ValueError(f"set only one of {prefix}.{global_key} (deprecated) and {prefix}.{per_gpu_key}")
    return derived


def ppo_batch_sizes(cfg: Any, *, rollout_n: int, dp_size: int, prefix: str,
                    use_dynamic_bsz: bool | None = None) -> PPOBatchSizes:
    """``ppo_mini_batch_size`` (prompts, global) as responses per device, and the checked micro size.

    ``cfg`` is the actor (``actor_rollout_ref.actor``) or the critic section; it is only read.
    """
    mini = cfg.get("ppo_mini_batch_size")
    if mini is None:
        raise ValueError(f"{prefix}.ppo_mini_batch_size is not set")
    mini = _divide(int(mini) * int(rollout_n), dp_size, f"{prefix}.ppo_mini_batch_size",
                   f"ppo_mini_batch_size * rollout.n ({mini} * {rollout_n})")
    micro = per_device_micro_size(cfg, "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", dp_size, prefix)
    dynamic = bool(cfg.get("use_dynamic_bsz", False)) if use_dynamic_bsz is None else use_dynamic_bsz
    if not dynamic:
        if micro is None:
            raise ValueError(f"set {prefix}.ppo_micro_batch_size_per_gpu (samples per forward/backward on one "
                             f"device), or {prefix}.use_dynamic_bsz=True")
        if mini % micro != 0:
            raise ValueError(f"{prefix}: the per-device mini-batch ({mini} = ppo_mini_batch_size * rollout.n / "
                             f"{dp_size}) is not divisible by ppo_micro_batch_size_per_gpu={micro}; choose a "
                             f"micro batch size that divides {mini}")
    return PPOBatchSizes(mini_batch_size=mini, micro_batch_size=micro)


def log_prob_micro_size(cfg: Any, dp_size: int, prefix: str, use_dynamic_bsz: bool) -> int | None:
    """``log_prob_micro_batch_size_per_gpu`` (or the deprecated global key / dp); required without dynamic bsz."""
    micro = per_device_micro_size(cfg, "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", dp_size,
                                  prefix)
    if micro is None and not use_dynamic_bsz:
        raise ValueError(f"set {prefix}.log_prob_micro_batch_size_per_gpu (samples per forward on one device), or "
                         f"{prefix}.log_prob_use_dynamic_bsz=True")
    return micro


def memory_metrics() -> dict[str, float]:
    """``perf/max_memory_allocated_gb`` (accelerator peak; on CPU: this process's peak RSS) and
    ``perf/cpu_memory_used_gb`` (host memory in use, as verl reports it)."""
    if get_device_name() == "cpu":
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1024**3  # ru_maxrss is KiB on Linux
    else:
        peak = max_memory_allocated_gb()
    used = psutil.virtual_memory().used / 1024**3
    return {"perf/max_memory_allocated_gb": float(peak), "perf/cpu_memory_used_gb": float(used)}


def env_flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in ("1", "true", "yes")
