"""Worker roles of one-step-off-policy training: the actor (its own pool, no rollout engine) and the detached
rollout (its own pool, a rollout engine only), plus the weight hand-off between them.

Weight transport: every actor rank takes part in gathering the full (unsharded) tensors, rank 0 puts them into
Ray's object store once as one ``{hf_name: tensor}`` dict and returns the object ref; the driver forwards that ref
to every rollout rank, which fetches it and loads it into its engine. The driver never deserializes the weights. The alternative, a gloo group spanning both pools, would
need both pools to enter a collective at the same moment, which blocks the rollout's in-flight generation;
the object store lets the push overlap with nothing but its own copy.
"""

from __future__ import annotations

import time

import ray
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

__all__ = ["DetachActorWorker", "DetachRolloutWorker"]


class DetachActorWorker(ActorRolloutRefWorker):
    """The actor role (optionally with the reference policy) that can hand its weights to a detached rollout."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def publish_weights(self):
        """Gather the full weights (a collective over the actor's ranks); rank 0 returns ``[ObjectRef]`` of
        the ``{name: cpu tensor}`` dict, the other ranks ``None``. Wrapped in a list so Ray hands the ref
        itself back to the driver instead of resolving it."""
        engine = self._require_actor("publish_weights")
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in engine.iter_full_params()}
        if dist.is_initialized() and dist.get_rank() != 0:
            return None
        return [ray.put(state)]


class DetachRolloutWorker(ActorRolloutRefWorker):
    """A rollout engine on its own processes; ``weight_version`` is the actor version it generates with."""

    def __init__(self, config, role: str = "rollout", **kwargs):
        super().__init__(config, role=role, **kwargs)
        if self.rollout_layout.tp > 1:
            raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={self.rollout_layout.tp}: the "
                             "one-step-off-policy rollout pool runs engines of one process each; set it to 1")
        self.weight_version = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_weights(self, weights_ref: list, version: int) -> float:
        """Load the actor's weights (``[ObjectRef]`` from :meth:`DetachActorWorker.publish_weights`) into the
        engine; returns the seconds it took (fetch + load)."""
        start = time.perf_counter()
        state = ray.get(weights_ref[0])
        self.rollout.update_weights(state.items())
        self.weight_version = int(version)
        return time.perf_counter() - start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_weight_version(self) -> int:
        return self.weight_version

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def async_generate_sequences(self, prompts: DataProto) -> DataProto:
        """``generate_sequences`` that returns to the driver at once (a ``DataProtoFuture``); the output's
        ``meta_info["weight_version"]`` is the actor version the responses were sampled with."""
        output = self.generate_sequences(prompts)
        output.meta_info["weight_version"] = self.weight_version
        return output
