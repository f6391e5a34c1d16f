"""Worker classes shared by the single-controller tests (pickled by value into Ray workers)."""

import os
import time

import torch

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import (
    Dispatch,
    Execute,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)


def rank_tagged(data: DataProto, rank: int, scale: float = 2.0) -> DataProto:
    n = len(data)
    return DataProto.from_dict(
        {"y": data.batch["x"] * scale, "rank": torch.full((n,), rank, dtype=torch.long)},
        meta_info={"rows": n},
    )


class EchoWorker(Worker):
    """Covers every built-in dispatch mode with tiny, checkable answers."""

    def __init__(self, offset: int = 0):
        super().__init__()
        self.offset = offset
        self.counter = 0
        # two dp meshes: "tp2" = one dp group of tp=2 (rank 0 collects); "rev" = dp=2 in reverse rank order
        self._register_dispatch_collect_info("tp2", dp_rank=0, is_collect=self.rank == 0)
        self._register_dispatch_collect_info("rev", dp_rank=self.world_size - 1 - self.rank, is_collect=True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add_rank(self, x):
        return x + self.rank + self.offset

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def echo(self, x):
        return (self.rank, x)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def whoami(self):
        return f"rank{self.rank}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def one_to_rank_zero(self, x):
        return [x, self.rank]

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def dp_square(self, x):
        return (self.rank, x * x)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return rank_tagged(data, self.rank)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, data: DataProto) -> DataProto:
        return rank_tagged(data, self.rank)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add_one_to_y(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"z": data.batch["y"] + 1, "rank": data.batch["rank"]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def metrics(self, data: DataProto):
        return {"rank": self.rank, "rows": len(data), "sum": float(data.batch["x"].sum())}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def slow_value(self, x, delay: float = 0.2):
        time.sleep(delay)
        return x * 10 + self.rank

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("tp2"))
    def mesh_tp2(self, data: DataProto) -> DataProto:
        return rank_tagged(data, self.rank)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("rev"))
    def mesh_rev(self, data: DataProto) -> DataProto:
        return rank_tagged(data, self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def bump(self):
        self.counter += 1
        return self.counter

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self):
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return {k: os.environ.get(k) for k in keys} | {"threads": torch.get_num_threads(), "pid": os.getpid()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float):
        import torch.distributed as dist

        from verl.utils.device import get_dist_backend

        if not dist.is_initialized():
            dist.init_process_group(backend=get_dist_backend())
        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, bad_rank: int):
        if self.rank == bad_rank:
            raise ValueError(f"deliberate failure in worker rank {self.rank}")
        return "ok"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float):
        time.sleep(seconds)
        return self.rank


class ActorRole(Worker):
    def __init__(self, lr: float):
        super().__init__()
        self.lr = lr

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute(self, data: DataProto) -> DataProto:
        return rank_tagged(data, self.rank, scale=self.lr)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def info(self):
        return {"role": "actor", "pid": os.getpid(), "rank": self.rank, "lr": self.lr}


class CriticRole(Worker):
    def __init__(self, bias: float = 0.0):
        super().__init__()
        self.bias = bias

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"v": data.batch["y"] + self.bias})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def info(self):
        return {"role": "critic", "pid": os.getpid(), "rank": self.rank, "bias": self.bias}


class RecordingEngine:
    """A stand-in engine for dispatch tests: 'generates' by echoing the prompt ids and records every batch."""

    def __init__(self):
        self.batches = []

    def generate_requests(self, requests):
        self.batches.append([(list(r.prompt_ids), r.request_id) for r in requests])
        return [list(r.prompt_ids) for r in requests]


class EngineGroupWorker(Worker):
    """Workers in the rollout layout of ``rollout.tensor_model_parallel_size = tp``: the "rollout" mesh dispatches
    prompts over the engines; inside an engine, tensor rank 0 leads the request-level calls."""

    def __init__(self, tp: int):
        super().__init__()
        import torch.distributed as dist

        from verl.utils.device import get_dist_backend
        from verl.workers.rollout.engine_group import new_engine_groups
        from verl.workers.rollout.layout import rollout_layout

        if not dist.is_initialized():
            dist.init_process_group(backend=get_dist_backend())
        self.layout = rollout_layout(dist.get_world_size(), dist.get_rank(), tp)
        self._register_dispatch_collect_info("rollout", dp_rank=self.layout.dp_rank, is_collect=self.layout.is_collect)
        self.group, self.leader = new_engine_groups(self.layout.all_groups())

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("rollout"))
    def generate(self, data: DataProto) -> DataProto:
        """Request-level generation in two engine batches (the leader decides them); every rank of the engine must
        have run the same batches, checked here across the engine."""
        import torch.distributed as dist

        from verl.workers.rollout.async_server import RolloutRequest
        from verl.workers.rollout.engine_group import EngineGroupLeader, follow_engine_leader

        engine = RecordingEngine()
        ids = data.batch["ids"].tolist()
        if self.layout.is_collect:
            leader = EngineGroupLeader(engine, self.group, self.leader)
            try:
                half = len(ids) // 2
                for part in (ids[:half], ids[half:]):
                    leader.generate_requests([RolloutRequest(prompt_ids=[i], params={"n": 1}, request_id=str(i))
                                              for i in part])
            finally:
                leader.finish()
        else:
            follow_engine_leader(engine, self.group, self.leader)
        seen = [None] * self.layout.tp
        dist.all_gather_object(seen, engine.batches, group=self.group)
        same = all(batches == seen[0] for batches in seen)
        generated = [i for batch in engine.batches for i, _ in batch]
        n = len(generated)
        return DataProto.from_dict({"ids": torch.tensor(generated).reshape(n, 1),
                                    "rank": torch.full((n,), self.rank, dtype=torch.long),
                                    "engine": torch.full((n,), self.layout.dp_rank, dtype=torch.long),
                                    "same_batches": torch.full((n,), int(same), dtype=torch.long)})
