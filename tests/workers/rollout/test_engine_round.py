"""Request-level calls of a vLLM engine with data parallelism (``rollout.data_parallel_size`` > 1) run in rounds
(``EngineRound``): over a real gloo world of 4 processes forming one engine of 2 data-parallel ranks x 2 tensor
ranks, leaders with different numbers of batches still make the same number of engine calls (empty ones while
the other is busy), and each leader's tensor rank replays its calls."""

from __future__ import annotations

import json
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp

from verl.workers.rollout.async_server import RolloutRequest
from verl.workers.rollout.engine_group import EngineGroupLeader, EngineRound, follow_engine_leader, new_engine_groups
from verl.workers.rollout.layout import rollout_layout

BATCHES = {0: [[1, 2]], 2: [[5], [6, 7], [8]]}  # data-parallel leader rank -> its engine batches


class RecordingEngine:
    def __init__(self):
        self.calls = []

    def generate_requests(self, requests):
        self.calls.append([r.prompt_ids[0] for r in requests])
        return [r.prompt_ids for r in requests]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    layout = rollout_layout(4, rank, 2, engine_dp=2)
    group, leader = new_engine_groups(layout.all_groups())
    round_group = new_engine_groups(layout.round_groups())[0]
    engine = RecordingEngine()
    results = []
    if layout.is_collect:
        rounds = EngineRound(EngineGroupLeader(engine, group, leader), round_group)
        try:
            for batch in BATCHES[rank]:
                results.append(rounds.generate_requests([RolloutRequest(prompt_ids=[i], params={}) for i in batch]))
        finally:
            rounds.finish()
        assert rounds.rounds == 3
    else:
        follow_engine_leader(engine, group, leader)
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(dict(calls=engine.calls, results=results), f)
    dist.destroy_process_group()


def test_leaders_with_uneven_work_make_the_same_engine_calls(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=4)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(4)]
    assert got[0]["calls"] == [[1, 2], [], []]  # its one batch, then empty calls while rank 2 still works
    assert got[2]["calls"] == [[5], [6, 7], [8]]
    assert got[1]["calls"] == got[0]["calls"] and got[3]["calls"] == got[2]["calls"]  # tensor ranks replay
    assert got[0]["results"] == [[[1], [2]]] and got[2]["results"] == [[[5]], [[6], [7]], [[8]]]
