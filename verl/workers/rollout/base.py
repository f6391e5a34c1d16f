"""The one interface every rollout engine (HF, vLLM, SGLang) implements.

The worker never talks to an engine directly except through these methods, so swapping
``actor_rollout_ref.rollout.name`` changes nothing else. The hybrid-engine sharding manager
(``verl/workers/sharding_manager/fsdp_rollout.py``) drives the weight and memory side
(``resume`` -> ``update_weights`` -> generate -> ``release_cache``); the worker drives generation.

Output of ``generate_sequences`` (see docs/dev/contracts.md): for ``B`` prompts and ``n`` samples each,
``B*n`` rows in interleaved order (all samples of prompt 0, then prompt 1, ...), with batch keys
``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``rollout_log_probs``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Iterable

import torch

if TYPE_CHECKING:  # annotations only: importing the rollout interface does not load tensordict
    from verl.protocol import DataProto

__all__ = ["BaseRollout"]


class BaseRollout(ABC):
    """A generation engine that lives inside a worker process next to the training engine."""

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample responses for left-padded ``prompts`` (keys ``input_ids``, ``attention_mask``, ``position_ids``)."""

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full (unsharded) tensors, given one at a time under their HF parameter names."""

    def generate_requests(self, requests: list) -> list:
        """Request-level generation (token in, token out) for :class:`~.async_server.AsyncRolloutServer`.

        ``requests``: :class:`~.async_server.RolloutRequest` items (prompt token ids + resolved sampling params);
        returns one :class:`~.async_server.TokenOutput` per request, in order. Engines that cannot serve requests
        leave this unimplemented, and ``rollout.mode=async`` then says so.
        """
        raise NotImplementedError(f"{type(self).__name__} has no request-level API; use actor_rollout_ref.rollout."
                                  f"name=hf or vllm with rollout.mode=async")

    def release_cache(self) -> None:
        """Free generation-time memory (KV cache; GPU engines go to sleep). Default: nothing to free."""

    def resume(self, tags: tuple[str, ...] | None = None) -> None:
        """Get ready for a weight push / generation (GPU engines wake up). ``tags``: wake only that part,
        ``("weights",)`` before the push and ``("kv_cache",)`` after it (``rollout.multi_stage_wake_up``: the KV
        cache is not allocated while the push needs memory); None wakes everything. Default: nothing to do."""
