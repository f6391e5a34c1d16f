"""Worker-side config handling: batch-size normalisation (verl's rules) and small shared helpers.

verl's batch-size keys are *global* on the driver side and *per device* inside a worker:

* ``ppo_mini_batch_size`` counts prompts; a worker sees ``ppo_mini_batch_size * rollout.n / dp_size``
  responses per mini-batch;
* the deprecated global ``ppo_micro_batch_size`` / ``log_prob_micro_batch_size`` are divided by ``dp_size`` and
  become the ``*_per_gpu`` keys ("per gpu" = per device; one CPU process counts as one device).

Every failure names the key and says what would divide.
"""

from __future__ import annotations

import os
import resource
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = [
    "as_mutable_config",
    "normalize_ppo_batch_sizes",
    "normalize_log_prob_batch_sizes",
    "normalize_micro_key",
    "memory_metrics",
]


def as_mutable_config(config: Any, copy: bool = False) -> DictConfig:
    """An OmegaConf DictConfig we may add keys to (dicts are converted; struct mode is switched off).

    ``copy=True`` returns a private deep copy: roles colocated in one process can receive the very same config
    object, and one role's normalisation must not leak into another's.
    """
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config if config is not None else {})
    elif copy:
        # resolve first: a subtree keeps its root, so absolute interpolations (${oc.select:actor_rollout_ref...})
        # still see the whole config here, but not in a detached copy
        config = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    OmegaConf.set_struct(config, False)
    return config


def _divide(value: int, dp_size: int, key: str, what: str) -> int:
    if value % dp_size != 0:
        raise ValueError(f"{key}: {what} = {value} is not divisible by the data-parallel size {dp_size} "
                         f"(the number of worker processes in this group); pick a multiple of {dp_size}")
    result = value // dp_size
    if result <= 0:
        raise ValueError(f"{key}: {what} = {value} gives {result} per device with {dp_size} devices; it must be "
                         f">= {dp_size}")
    return result


def normalize_micro_key(cfg: DictConfig, global_key: str, per_gpu_key: str, dp_size: int, prefix: str) -> None:
    """``cfg.<global_key>`` (deprecated, global) -> ``cfg.<per_gpu_key>``, divided by ``dp_size``."""
    global_value = cfg.get(global_key)
    if global_value is not None:
        per_gpu = _divide(int(global_value), dp_size, f"{prefix}.{global_key}", global_key)
        if cfg.get(per_gpu_key) not in (None, per_gpu):
            raise ValueError(f"set only one of {prefix}.{global_key} (deprecated) and {prefix}.{per_gpu_key}")
        cfg[global_key] = per_gpu
        cfg[per_gpu_key] = per_gpu


def normalize_ppo_batch_sizes(cfg: DictConfig, *, rollout_n: int, dp_size: int, prefix: str,
                              use_dynamic_bsz: bool | None = None) -> None:
    """Turn ``cfg.ppo_mini_batch_size`` (prompts, global) into responses per device, in place; check the micro size.

    ``cfg`` is the actor (``actor_rollout_ref.actor``) or the critic subtree. Idempotent via a marker key.
    """
    if cfg.get("_normalized_dp_size") is not None:
        return
    mini = cfg.get("ppo_mini_batch_size")
    if mini is None:
        raise ValueError(f"{prefix}.ppo_mini_batch_size is not set")
    mini = _divide(int(mini) * int(rollout_n), dp_size, f"{prefix}.ppo_mini_batch_size",
                   f"ppo_mini_batch_size * rollout.n ({mini} * {rollout_n})")
    cfg.ppo_mini_batch_size = mini
    normalize_micro_key(cfg, "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", dp_size, prefix)
    dynamic = bool(cfg.get("use_dynamic_bsz", False)) if use_dynamic_bsz is None else use_dynamic_bsz
    micro = cfg.get("ppo_micro_batch_size_per_gpu")
    if not dynamic:
        if micro is None:
            raise ValueError(f"set {prefix}.ppo_micro_batch_size_per_gpu (samples per forward/backward on one "
                             f"device), or {prefix}.use_dynamic_bsz=True")
        if mini % int(micro) != 0:
            raise ValueError(f"{prefix}: the per-device mini-batch ({mini} = ppo_mini_batch_size * rollout.n / "
                             f"{dp_size}) is not divisible by ppo_micro_batch_size_per_gpu={micro}; choose a "
                             f"micro batch size that divides {mini}")
    cfg["_normalized_dp_size"] = dp_size


def normalize_log_prob_batch_sizes(cfg: DictConfig, dp_size: int, prefix: str) -> None:
    """``log_prob_micro_batch_size`` (global, deprecated) -> ``log_prob_micro_batch_size_per_gpu``."""
    if cfg.get("_normalized_log_prob_dp_size") is not None:
        return
    normalize_micro_key(cfg, "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", dp_size, prefix)
    cfg["_normalized_log_prob_dp_size"] = dp_size


def require_log_prob_micro(cfg: DictConfig, prefix: str, use_dynamic_bsz: bool) -> int | None:
    micro = cfg.get("log_prob_micro_batch_size_per_gpu")
    if micro is None and not use_dynamic_bsz:
        raise ValueError(f"set {prefix}.log_prob_micro_batch_size_per_gpu (samples per forward on one device), or "
                         f"{prefix}.log_prob_use_dynamic_bsz=True")
    return micro


def memory_metrics() -> dict[str, float]:
    """``perf/max_memory_allocated_gb`` (accelerator peak; on CPU: this process's peak RSS) and
    ``perf/cpu_memory_used_gb`` (host memory in use, as verl reports it)."""
    from verl.utils.device import get_device_name, max_memory_allocated_gb

    if get_device_name() == "cpu":
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1024**3  # ru_maxrss is KiB on Linux
    else:
        peak = max_memory_allocated_gb()
    try:
        import psutil

        used = psutil.virtual_memory().used / 1024**3
    except ImportError:  # pragma: no cover
        used = float("nan")
    return {"perf/max_memory_allocated_gb": float(peak), "perf/cpu_memory_used_gb": float(used)}


def env_flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in ("1", "true", "yes")
