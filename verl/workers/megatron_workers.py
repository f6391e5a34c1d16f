"""Megatron workers: the FSDP workers' roles with Megatron's data-parallel dispatch.

The roles, their methods and their losses are those of ``verl.workers.engine_workers`` (``actor``, ``rollout``,
``ref``, ``actor_rollout``, ``actor_rollout_ref``; ``CriticWorker``), whose training-engine calls already
dispatch by data-parallel rank (the ``actor`` / ``critic`` meshes); the engine is chosen by
``strategy=megatron`` (``verl.workers.engine.megatron``). What changes is the layout of those meshes:
the ``tensor_model_parallel_size x pipeline_model_parallel_size`` processes of one data-parallel rank hold one
model replica between them, so they all receive that rank's chunk, and the result of the chunk is taken from
one of them (tensor rank 0 of the last pipeline stage, where outputs are computed). Per-device batch sizes
divide by the data-parallel size ``world / (tp * pp)``.

Generation follows the rollout layout (``rollout.tensor_model_parallel_size = t``, independent of Megatron's):
engines of t consecutive ranks each. When t equals Megatron's tensor-parallel size the engines are exactly the
Megatron tensor groups, and each rank hands its engine rank its own shard (no gather; only the vocabulary rows
whose padding differs move). Otherwise the full weights are streamed in from the Megatron shards (gathered per
parameter, pipeline stages broadcasting their layers) and each engine rank keeps its slice.

Process layout (megatron's order): tensor rank fastest, then data-parallel rank, then pipeline stage.
"""

from __future__ import annotations

import torch.distributed as dist

from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.workers import engine_workers
from verl.workers.config_utils import per_device_micro_size, ppo_batch_sizes
from verl.workers.engine import MicroBatchSpec

__all__ = ["ActorRolloutRefWorker", "AsyncActorRolloutRefWorker", "CriticWorker", "RewardModelWorker",
           "megatron_grid"]


def megatron_grid(megatron_cfg, world: int, prefix: str) -> dict:
    """This process's (tp, pp, dp) ranks and sizes in megatron's layout, from the typed ``<prefix>.megatron``
    section (``verl.workers.config.McoreEngineConfig``)."""
    tp = int(megatron_cfg.tensor_model_parallel_size)
    pp = int(megatron_cfg.pipeline_model_parallel_size)
    if world % (tp * pp):
        raise ValueError(f"{prefix}.megatron: tensor_model_parallel_size * pipeline_model_parallel_size = {tp} * "
                         f"{pp} does not divide the {world} processes of this worker group (trainer.n_gpus_per_node "
                         "x trainer.nnodes)")
    dp = world // (tp * pp)
    rank = dist.get_rank()
    pp_rank = rank // (tp * dp)
    return {"tp": tp, "pp": pp, "dp": dp, "tp_rank": rank % tp, "dp_rank": (rank // tp) % dp, "pp_rank": pp_rank,
            "collect": rank % tp == 0 and pp_rank == pp - 1}


class ActorRolloutRefWorker(engine_workers.ActorRolloutRefWorker):
    """The FSDP worker's roles on Megatron engines; see the module docstring."""

    def _megatron_grid(self) -> dict:
        section = "actor" if self._is_actor or not self._is_ref else "ref"
        role = self.actor_config if section == "actor" else self.typed.ref
        return megatron_grid(role.megatron, dist.get_world_size(), f"actor_rollout_ref.{section}")

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        # the FSDP worker declares its own data-parallel layout for the "actor" mesh; here it is Megatron's (the
        # "rollout" mesh follows the rollout layout, independent of the training layout)
        if mesh_name == "actor":
            grid = self._megatron_grid()
            dp_rank, is_collect = grid["dp_rank"], grid["collect"]
        super()._register_dispatch_collect_info(mesh_name, dp_rank, is_collect)

    def __init__(self, config, role: str, **kwargs):
        super().__init__(config, role, **kwargs)
        self.grid = self._megatron_grid()
        self.dp_size = self.grid["dp"]  # ranks holding different rows: per-device sizes divide by it
        if self._is_actor:
            self.actor_batch_sizes = ppo_batch_sizes(self.actor_config, rollout_n=self.rollout_n,
                                                     dp_size=self.dp_size, prefix="actor_rollout_ref.actor")
        for name in list(self._log_prob_micro):
            if self._ref_in_actor and name == "ref":
                continue
            self._log_prob_micro[name] = self._log_prob_spec(name)
        if self._ref_in_actor and "rollout" in self._log_prob_micro:
            self._log_prob_micro["ref"] = self._log_prob_micro["rollout"]


AsyncActorRolloutRefWorker = ActorRolloutRefWorker


class CriticWorker(engine_workers.CriticWorker):
    """The FSDP critic's methods on a Megatron engine (value head on the last stage)."""

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        grid = megatron_grid(self.critic_config.megatron, dist.get_world_size(), "critic")
        super()._register_dispatch_collect_info(mesh_name, grid["dp_rank"], grid["collect"])

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.grid = megatron_grid(self.critic_config.megatron, dist.get_world_size(), "critic")
        self.dp_size = self.grid["dp"]
        self.batch_sizes = ppo_batch_sizes(self.critic_config, rollout_n=self.critic_config.rollout_n, dp_size=self.dp_size,
                                           prefix="critic")
        forward_micro = per_device_micro_size(self.critic_config, "forward_micro_batch_size",
                                              "forward_micro_batch_size_per_gpu", self.dp_size, "critic")
        self.forward_micro = MicroBatchSpec(
            micro_batch_size=forward_micro if forward_micro is not None else self.batch_sizes.micro_batch_size,
            use_dynamic_bsz=self.forward_micro.use_dynamic_bsz, max_token_len=self.forward_micro.max_token_len)


class RewardModelWorker(engine_workers.RewardModelWorker):
    """The FSDP reward-model worker's scoring (``compute_rm_score``: the sequence classifier's score at the last
    valid token) on the Megatron engine with ``reward_model.strategy=megatron``: the
    ``reward_model.megatron`` tensor x pipeline ranks of one data-parallel rank get the same rows and tensor rank 0
    of the last stage returns their scores. With ``reward_model.strategy=fsdp`` every process is its own
    data-parallel rank, as in the FSDP worker."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        if self.rm_config.strategy == "megatron" and self.rm_config.megatron is not None:
            grid = megatron_grid(self.rm_config.megatron, dist.get_world_size(), "reward_model")
            dp_rank, collect, self.dp_size = grid["dp_rank"], grid["collect"], grid["dp"]
            self.micro_batch_size = per_device_micro_size(self.config, "micro_batch_size",
                                                          "micro_batch_size_per_gpu", self.dp_size, "reward_model")
        else:
            dp_rank, collect = dist.get_rank(), True
        self._register_dispatch_collect_info("reward_model", dp_rank, collect)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("reward_model"))
    def compute_rm_score(self, data):
        return engine_workers.RewardModelWorker.compute_rm_score(self, data)
