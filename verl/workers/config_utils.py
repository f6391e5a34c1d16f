"""Worker-side config handling: batch-size normalisation (verl's rules) and small shared helpers.

verl's batch-size keys are *global* on the driver side and *per device* inside a worker:

* ``ppo_mini_batch_size`` counts prompts; a worker sees ``ppo_mini_batch_size * rollout.n / dp_size``
  responses per mini-batch;
* the deprecated global ``ppo_micro_batch_size`` / ``log_prob_micro_batch_size`` are divided by ``dp_size`` and
  become the ``*_per_gpu`` keys ("per gpu" = per device; one CPU process counts as one device).

Every failure names the key and says what would divide. The rules live in one place
(``verl.utils.batch_sizes``, which the driver's validation uses too); these functions only read the config and
return the derived sizes, computed once when a worker starts.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Any

import psutil
from omegaconf import DictConfig, OmegaConf

from verl.utils.batch_sizes import normalized_batch_sizes, per_rank_size
from verl.utils.config import ConfigError
from verl.utils.device import get_device_name, max_memory_allocated_gb

__all__ = ["read_only_config", "PPOBatchSizes", "ppo_batch_sizes", "per_device_micro_size", "log_prob_micro_size",
           "memory_metrics"]


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


def per_device_micro_size(cfg: Any, global_key: str, per_gpu_key: str, dp_size: int, prefix: str) -> int | None:
    """``cfg.<per_gpu_key>``, or the deprecated global ``cfg.<global_key>`` divided by ``dp_size`` (it wins)."""
    return per_rank_size(cfg, global_key, per_gpu_key, dp_size, f"{prefix}.")


def ppo_batch_sizes(cfg: Any, *, rollout_n: int, dp_size: int, prefix: str,
                    use_dynamic_bsz: bool | None = None) -> PPOBatchSizes:
    """``ppo_mini_batch_size`` (prompts, global) as responses per device, and the checked micro size
    (``verl.utils.batch_sizes.normalized_batch_sizes``). ``cfg`` is the actor or critic section; it is only read."""
    if cfg.get("ppo_mini_batch_size") is None:
        raise ConfigError(f"{prefix}.ppo_mini_batch_size is not set")
    sizes = normalized_batch_sizes(cfg, rollout_n, dp_size, prefix=f"{prefix}.", use_dynamic_bsz=use_dynamic_bsz)
    return PPOBatchSizes(mini_batch_size=sizes.ppo_mini_batch_size, micro_batch_size=sizes.ppo_micro_batch_size_per_gpu)


def log_prob_micro_size(cfg: Any, dp_size: int, prefix: str, use_dynamic_bsz: bool) -> int | None:
    """``log_prob_micro_batch_size_per_gpu`` (or the deprecated global key / dp); required without dynamic bsz."""
    micro = per_device_micro_size(cfg, "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", dp_size,
                                  prefix)
    if micro is None and not use_dynamic_bsz:
        raise ConfigError(f"set {prefix}.log_prob_micro_batch_size_per_gpu (samples per forward on one device), or "
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
