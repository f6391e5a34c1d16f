"""Megatron workers: the FSDP workers' roles with Megatron's data-parallel dispatch.

The roles, their methods and their losses are those of ``verl.workers.fsdp_workers`` (``actor``, ``rollout``,
``ref``, ``actor_rollout``, ``actor_rollout_ref``; ``CriticWorker``); the engine is chosen by
``strategy=megatron`` (``verl.workers.engine.megatron``). What changes is how batches reach the processes:
the ``tensor_model_parallel_size x pipeline_model_parallel_size`` processes of one data-parallel rank hold one
model replica between them, so they all receive that rank's chunk, and the result of the chunk is taken from
one of them (tensor rank 0 of the last pipeline stage, where outputs are computed). Per-device batch sizes
divide by the data-parallel size ``world / (tp * pp)``.

Generation is unchanged: every process runs its own rollout engine on its share of the prompts, with the full
weights streamed in from the Megatron shards (gathered per parameter) before each generation.

Process layout (megatron's order): tensor rank fastest, then data-parallel rank, then pipeline stage.
"""

from __future__ import annotations

import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.workers import fsdp_workers
from verl.workers.config_utils import per_device_micro_size, ppo_batch_sizes
from verl.workers.engine import MicroBatchSpec
from verl.workers.rollout.utils import cfg_get
from verl.workers.worker_utils import init_distributed

__all__ = ["ActorRolloutRefWorker", "AsyncActorRolloutRefWorker", "CriticWorker", "RewardModelWorker",
           "megatron_grid"]

_ACTOR_MESH = make_nd_compute_dataproto_dispatch_fn("actor")
_CRITIC_MESH = make_nd_compute_dataproto_dispatch_fn("critic")


def megatron_grid(megatron_cfg, world: int, prefix: str) -> dict:
    """This process's (tp, pp, dp) ranks and sizes in megatron's layout, from ``<prefix>.megatron``."""
    tp = int(cfg_get(megatron_cfg, "tensor_model_parallel_size", 1) or 1)
    pp = int(cfg_get(megatron_cfg, "pipeline_model_parallel_size", 1) or 1)
    if world % (tp * pp):
        raise ValueError(f"{prefix}.megatron: tensor_model_parallel_size * pipeline_model_parallel_size = {tp} * "
                         f"{pp} does not divide the {world} processes of this worker group (trainer.n_gpus_per_node "
                         "x trainer.nnodes)")
    dp = world // (tp * pp)
    rank = dist.get_rank()
    pp_rank = rank // (tp * dp)
    return {"tp": tp, "pp": pp, "dp": dp, "tp_rank": rank % tp, "dp_rank": (rank // tp) % dp, "pp_rank": pp_rank,
            "collect": rank % tp == 0 and pp_rank == pp - 1}


class ActorRolloutRefWorker(fsdp_workers.ActorRolloutRefWorker):
    """The FSDP worker's roles on Megatron engines; see the module docstring."""

    def __init__(self, config, role: str, **kwargs):
        super().__init__(config, role, **kwargs)
        section = "actor" if self._is_actor or not self._is_ref else "ref"
        prefix = f"actor_rollout_ref.{section}"
        grid = megatron_grid(cfg_get(self.config.get(section), "megatron", None), dist.get_world_size(), prefix)
        self.grid = grid
        self.mcore_dp = grid["dp"]
        if self._is_actor:
            self.actor_batch_sizes = ppo_batch_sizes(self.config.get("actor"), rollout_n=self.rollout_n,
                                                     dp_size=self.mcore_dp, prefix="actor_rollout_ref.actor")
        for name in list(self._log_prob_micro):
            sub = self.config.get(name)
            if sub is not None:
                self._log_prob_micro[name] = self._log_prob_spec(sub, f"actor_rollout_ref.{name}")
        if self._ref_in_actor and "rollout" in self._log_prob_micro:
            self._log_prob_micro["ref"] = self._log_prob_micro["rollout"]
        self._register_dispatch_collect_info("actor", dp_rank=grid["dp_rank"], is_collect=grid["collect"])

    def _log_prob_spec(self, section, prefix: str) -> MicroBatchSpec:
        # called by the FSDP worker's __init__ before self.mcore_dp exists: its result is then recomputed
        dp = getattr(self, "mcore_dp", None)
        if dp is None:
            return MicroBatchSpec(micro_batch_size=None, use_dynamic_bsz=True, max_token_len=1)
        from verl.workers.config_utils import log_prob_micro_size

        actor_cfg = self.config.get("actor")
        dynamic = bool(cfg_get(section, "log_prob_use_dynamic_bsz", cfg_get(actor_cfg, "use_dynamic_bsz", False)))
        return MicroBatchSpec(
            micro_batch_size=log_prob_micro_size(section, dp, prefix, dynamic), use_dynamic_bsz=dynamic,
            max_token_len=int(cfg_get(section, "log_prob_max_token_len_per_gpu",
                                      cfg_get(actor_cfg, "ppo_max_token_len_per_gpu", 16384))))

    @register(dispatch_mode=_ACTOR_MESH)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        return super().compute_log_prob(data)

    @register(dispatch_mode=_ACTOR_MESH)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        return super().compute_ref_log_prob(data)

    @register(dispatch_mode=_ACTOR_MESH)
    def update_actor(self, data: DataProto) -> DataProto:
        return super().update_actor(data)


AsyncActorRolloutRefWorker = ActorRolloutRefWorker


class CriticWorker(fsdp_workers.CriticWorker):
    """The FSDP critic's methods on a Megatron engine (value head on the last stage)."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        init_distributed()
        grid = megatron_grid(cfg_get(self.config, "megatron", None), dist.get_world_size(), "critic")
        self.grid = grid
        self.mcore_dp = grid["dp"]
        rollout_n = int(cfg_get(self.config, "rollout_n", 1))
        self.batch_sizes = ppo_batch_sizes(self.config, rollout_n=rollout_n, dp_size=self.mcore_dp, prefix="critic")
        forward_micro = per_device_micro_size(self.config, "forward_micro_batch_size",
                                              "forward_micro_batch_size_per_gpu", self.mcore_dp, "critic")
        self.forward_micro = MicroBatchSpec(
            micro_batch_size=forward_micro if forward_micro is not None else self.batch_sizes.micro_batch_size,
            use_dynamic_bsz=self.forward_micro.use_dynamic_bsz, max_token_len=self.forward_micro.max_token_len)
        self._register_dispatch_collect_info("critic", dp_rank=grid["dp_rank"], is_collect=grid["collect"])

    @register(dispatch_mode=_CRITIC_MESH)
    def compute_values(self, data: DataProto) -> DataProto:
        return super().compute_values(data)

    @register(dispatch_mode=_CRITIC_MESH)
    def update_critic(self, data: DataProto) -> DataProto:
        return super().update_critic(data)


class RewardModelWorker(fsdp_workers.RewardModelWorker):
    """Model-based rewards with ``reward_model.strategy=megatron`` are refused before workers start; this class
    exists so the three worker classes come from one module."""
