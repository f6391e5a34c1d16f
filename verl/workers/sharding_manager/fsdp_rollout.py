"""The hybrid-engine handoff: FSDP2 training shards -> the rollout engine living in the same process.

Use::

    manager = FSDPRolloutShardingManager(actor_fsdp_module, rollout)
    ...
    manager.bump_weight_version()          # after every optimizer step / checkpoint load
    with manager:                          # pushes the new weights (once per version), wakes the engine
        out = rollout.generate_sequences(prompts)
                                           # on exit: rollout.release_cache()

The push streams the actor's full HF-named tensors into ``rollout.update_weights``, gathering the shards a
bucket at a time (one collective per 256 MB of full tensors; with ``layered_summon`` one parameter at a time, so
at most one unsharded parameter exists beyond the engine's own copy). It is a collective: every rank of the actor's mesh must enter the manager together, which the worker's
data-parallel dispatch guarantees.

LoRA actors, two ways:

* adapter-only (default when the engine supports it, i.e. vLLM started with ``enable_lora``): the frozen base
  weights are pushed once, then every push hands the engine only the adapter (``lora_A`` / ``lora_B`` under
  PEFT's names plus the adapter config) through ``rollout.update_lora_adapter``;
* merged (``lora_merge=True``, or an engine without adapter support): the adapters are merged on the fly
  (``W + scale * B @ A``) and the full model pushed under plain HF names every time.

``push_stats`` holds, for the last push: ``weight_push_tensors`` / ``weight_push_bytes`` (what this rank's engine
loaded), ``weight_push_base`` (1 when base weights went out), ``weight_push_recv_bytes`` (what this rank received
from other ranks to build the stream, when the stream reports it) and ``weight_push_peak_mem_gb`` (this process's
peak memory while pushing: resident memory on CPU, allocated accelerator memory otherwise).

``tp_pieces=True``: the stream carries this rank's tensor-parallel pieces (a Megatron actor with the rollout's
tensor-parallel size), and the engine copies them in without narrowing (``rollout.update_weights(...,
tp_pieces=True)``).

``timing`` holds ``update_weights`` (seconds, 0 when no push was needed) after each ``__enter__``.

For tests of the correctness metric there is a deliberate fault switch: ``skip_weight_sync=True`` or the
env ``VERL_DEBUG_SKIP_WEIGHT_SYNC=1`` never pushes weights, leaving the engine stale after the first update
(``training/rollout_probs_diff_*`` must then show it).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from typing import Callable, Iterable, Iterator

import psutil
import torch
import torch.nn as nn

from verl.utils.device import get_device_name, max_memory_allocated_gb, reset_peak_memory_stats
from verl.utils.fsdp_utils import GATHER_BUCKET_BYTES, hf_name, is_peft_model, iter_full_state_dict
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.vllm_rollout.lora_adapter import adapter_config_dict, peft_adapter_name

from .base import BaseShardingManager

__all__ = ["FSDPRolloutShardingManager", "iter_base_tensors", "iter_hf_named_tensors", "iter_lora_adapter_tensors",
           "lora_adapter_config", "merge_lora_stream"]

logger = logging.getLogger(__name__)

SKIP_SYNC_ENV = "VERL_DEBUG_SKIP_WEIGHT_SYNC"
_PEFT_PREFIX = "base_model.model."
_LORA_RE = re.compile(r"^(?P<mod>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")


def _full(t: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(t, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else t


def _fallback_full_state_iter(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """One full tensor per state-dict entry (DTensor shards gathered one at a time)."""
    for name, tensor in module.state_dict().items():
        yield name, _full(tensor).detach()


def merge_lora_stream(named: Iterable[tuple[str, torch.Tensor]], scaling: dict[str, float] | float) -> Iterator[
        tuple[str, torch.Tensor]]:
    """Turn a PEFT LoRA state stream into plain HF names with the adapters merged into the base weights.

    ``x.base_layer.weight`` is held until its ``lora_A`` / ``lora_B`` arrive (state-dict order keeps them
    adjacent), then ``W + scaling * B @ A`` is yielded as ``x.weight``. ``scaling`` is ``lora_alpha / r``,
    per adapter name or one float.
    """
    pending: dict[str, dict] = {}
    for name, tensor in named:
        if name.startswith(_PEFT_PREFIX):
            name = name[len(_PEFT_PREFIX):]
        m = _LORA_RE.match(name)
        if m is not None:
            entry = pending.setdefault(m["mod"], {})
            entry[m["ab"]] = tensor
            entry["adapter"] = m["adapter"]
        elif name.endswith(".base_layer.weight"):
            pending.setdefault(name[: -len(".base_layer.weight")], {})["W"] = tensor
        elif ".base_layer." in name:
            yield name.replace(".base_layer.", "."), tensor
            continue
        else:
            yield name, tensor
            continue
        mod = m["mod"] if m is not None else name[: -len(".base_layer.weight")]
        entry = pending[mod]
        if {"W", "A", "B"} <= entry.keys():
            scale = scaling[entry["adapter"]] if isinstance(scaling, dict) else scaling
            w = entry["W"]
            merged = (w.float() + scale * (entry["B"].float() @ entry["A"].float())).to(w.dtype)
            del pending[mod]
            yield f"{mod}.weight", merged
    if pending:
        raise RuntimeError(f"LoRA merge: incomplete adapter tensors for {sorted(pending)[:3]}")


def _lora_scaling(module: nn.Module) -> dict[str, float] | None:
    peft_config = getattr(module, "peft_config", None)
    if not peft_config:
        return None
    return {name: float(cfg.lora_alpha) / float(cfg.r) for name, cfg in peft_config.items()}


def iter_hf_named_tensors(module: nn.Module, bucket_bytes: int = GATHER_BUCKET_BYTES
                          ) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream the module's full weights under HF names (LoRA merged), gathered ``bucket_bytes`` at a time."""
    for name, tensor in iter_full_state_dict(module, bucket_bytes=bucket_bytes):  # HF names, LoRA already merged
        if name.endswith("rotary_emb.inv_freq"):
            continue
        yield name, tensor


def iter_base_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """A PEFT model's frozen base weights under plain HF names, adapters left out (not merged)."""
    with torch.no_grad():
        for key, value in module.state_dict().items():
            name = hf_name(key)
            if name is None or name.endswith("rotary_emb.inv_freq"):
                continue
            yield name, _full(value).detach()


def iter_lora_adapter_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """A PEFT model's LoRA A/B matrices (full tensors, one at a time) under the names PEFT saves them."""
    with torch.no_grad():
        for key, value in module.state_dict().items():
            name = peft_adapter_name(key)
            if name is not None:
                yield name, _full(value).detach()


def lora_adapter_config(module: nn.Module) -> dict:
    """``adapter_config.json`` contents of the PEFT model's (single) active adapter."""
    configs = getattr(module, "peft_config", None) or {}
    if len(configs) != 1:
        raise ValueError(f"adapter-only LoRA push needs exactly one adapter, the actor has {sorted(configs)}")
    return adapter_config_dict(next(iter(configs.values())))


class PeakMemory:
    """This process's peak memory over a weight stream: resident set size sampled at every tensor on CPU, the
    accelerator's allocation peak otherwise (its peak counter is reset when the push starts)."""

    def __init__(self):
        self.on_cpu = get_device_name() == "cpu"
        self._process = psutil.Process()
        self._peak = self._process.memory_info().rss if self.on_cpu else 0
        if not self.on_cpu:
            reset_peak_memory_stats()

    def watch(self, stream: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for item in stream:
            if self.on_cpu:
                self._peak = max(self._peak, self._process.memory_info().rss)
            yield item

    def peak_gb(self) -> float:
        if self.on_cpu:
            self._peak = max(self._peak, self._process.memory_info().rss)
            return self._peak / 1024**3
        return max_memory_allocated_gb()


class FSDPRolloutShardingManager(BaseShardingManager):
    """Pushes the FSDP actor's weights into a :class:`BaseRollout` when they changed; see the module docstring.

    Args:
        module: the (FSDP2-sharded or plain) actor module.
        rollout: the engine.
        full_state_iter: optional override for the tensor stream (``module -> iterator of (name, tensor)``).
        skip_weight_sync: fault switch for tests (also env ``VERL_DEBUG_SKIP_WEIGHT_SYNC=1``).
        lora_merge: LoRA actors: push the merged full model every time instead of the adapter only.
        base_state_iter / adapter_state_iter: optional overrides of the adapter-only streams (``module -> iterator
            of (name, tensor)``; default :func:`iter_base_tensors` / :func:`iter_lora_adapter_tensors`).
        layered_summon: ``rollout.layered_summon``: gather one parameter at a time (least memory) instead of
            256 MB buckets (fewest collectives). Both push the same tensors.
    """

    def __init__(self, module: nn.Module, rollout: BaseRollout, *, full_state_iter: Callable | None = None,
                 device_mesh=None, offload_param: bool = False, skip_weight_sync: bool | None = None,
                 lora_merge: bool = False, base_state_iter: Callable | None = None,
                 adapter_state_iter: Callable | None = None, layered_summon: bool = False, tp_pieces: bool = False,
                 stream_stats: dict | None = None, multi_stage_wake_up: bool = False, **_ignored):
        self.module = module
        self.multi_stage_wake_up = bool(multi_stage_wake_up)
        self.tp_pieces = bool(tp_pieces)
        self.stream_stats = stream_stats if stream_stats is not None else {}
        self.layered_summon = bool(layered_summon)
        self.rollout = rollout
        self.device_mesh = device_mesh
        self.offload_param = offload_param
        self.full_state_iter = full_state_iter or (
            functools.partial(iter_hf_named_tensors, bucket_bytes=0) if self.layered_summon else iter_hf_named_tensors)
        if skip_weight_sync is None:
            skip_weight_sync = os.environ.get(SKIP_SYNC_ENV, "0").lower() in ("1", "true", "yes")
        self.skip_weight_sync = skip_weight_sync
        self.weight_version = 0
        self._pushed_version: int | None = None  # None: never pushed, so the first entry pushes
        self.timing: dict[str, float] = {}
        self.num_pushes = 0
        self.lora_adapter_push = (not lora_merge and is_peft_model(module)
                                  and bool(getattr(rollout, "supports_lora_adapter", False)))
        self.base_state_iter = base_state_iter or iter_base_tensors
        self.adapter_state_iter = adapter_state_iter or iter_lora_adapter_tensors
        self._base_pushed = False
        self.push_stats: dict[str, float] = {}

    # verl's old private name for the fault switch
    @property
    def _skip_weight_sync_for_test(self) -> bool:
        return self.skip_weight_sync

    @_skip_weight_sync_for_test.setter
    def _skip_weight_sync_for_test(self, value: bool) -> None:
        self.skip_weight_sync = bool(value)

    def bump_weight_version(self) -> int:
        """Record that the actor's weights changed (optimizer step, checkpoint load)."""
        self.weight_version += 1
        return self.weight_version

    @property
    def weights_stale(self) -> bool:
        return self._pushed_version != self.weight_version

    def sync_weights(self) -> float:
        """Push now (regardless of the version); returns the seconds it took."""
        start = time.perf_counter()
        tensors = nbytes = 0.0
        sent_base = True
        self.stream_stats.clear()
        peak = PeakMemory()
        if self.lora_adapter_push:
            sent_base = not self._base_pushed
            if sent_base:  # the frozen base goes out once (the engine may hold dummy or stale weights)
                self.rollout.update_weights(peak.watch(self.base_state_iter(self.module)))
                tensors, nbytes = self._engine_stats()
                self._base_pushed = True
            self.rollout.update_lora_adapter(peak.watch(self.adapter_state_iter(self.module)),
                                             lora_adapter_config(self.module))
        elif self.tp_pieces:
            self.rollout.update_weights(peak.watch(self.full_state_iter(self.module)), tp_pieces=True)
        else:
            self.rollout.update_weights(peak.watch(self.full_state_iter(self.module)))
        last_tensors, last_bytes = self._engine_stats()
        self.push_stats = {"weight_push_tensors": tensors + last_tensors, "weight_push_bytes": nbytes + last_bytes,
                           "weight_push_base": float(sent_base), "weight_push_peak_mem_gb": peak.peak_gb()}
        if "recv_bytes" in self.stream_stats:
            self.push_stats["weight_push_recv_bytes"] = float(self.stream_stats["recv_bytes"])
        self.num_pushes += 1
        return time.perf_counter() - start

    def _engine_stats(self) -> tuple[float, float]:
        """(tensors, bytes) the engine reports for its last update call (0 when it reports nothing)."""
        stats = getattr(self.rollout, "last_update_stats", {}) or {}
        return stats.get("num_tensors", 0.0), stats.get("num_bytes", 0.0)

    def __enter__(self):
        self.timing = {"update_weights": 0.0}
        # rollout.multi_stage_wake_up: the weights wake for the push, the KV cache only after it
        if self.multi_stage_wake_up:
            self.rollout.resume(("weights",))
        else:
            self.rollout.resume()
        if self.weights_stale:
            if self.skip_weight_sync:
                logger.warning("%s is set: NOT pushing actor weights (version %d) into the rollout engine",
                               SKIP_SYNC_ENV, self.weight_version)
            else:
                self.timing["update_weights"] = self.sync_weights()
            self._pushed_version = self.weight_version
        if self.multi_stage_wake_up:
            self.rollout.resume(("kv_cache",))
        return self

    def __exit__(self, exc_type, exc, tb):
        self.rollout.release_cache()
        return False
