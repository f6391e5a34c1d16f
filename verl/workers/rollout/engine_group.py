"""One generation engine spread over several worker processes (rollout tensor parallel > 1).

The ranks of a tensor-parallel engine run the same engine program: every engine call (``generate_sequences``,
``generate_requests``) must happen on all of them, with the same requests in the same order, or the engine's
collectives pair up the wrong work. The batch path gets this for free (dispatch hands every rank of an engine the
same prompts). The request-level path (``rollout.mode=async``, agent loops, tools) does not: which requests form an
engine batch depends on when episodes become ready (tool latency, other episodes), which differs between
processes. So one rank leads:

* tensor rank 0 runs the agent loop; its engine is wrapped in :class:`EngineGroupLeader`, which broadcasts each
  batch of requests (prompt ids, sampling params, request ids) to the other ranks before running it;
* every other rank runs :func:`follow_engine_leader`: receive a batch, run the same engine call, until the leader
  says the rollout is over (:meth:`EngineGroupLeader.finish`).

The leader's results are the engine's results (the ``rollout`` dispatch mesh collects tensor rank 0).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .async_server import RolloutRequest

__all__ = ["EngineGroupLeader", "follow_engine_leader", "new_engine_groups"]

_DONE = None  # what the leader broadcasts when the rollout is over


def new_engine_groups(groups: list[list[int]]):
    """Create a gloo process group per engine (collective: every rank calls it with the same list); returns this
    rank's group and the global rank of its leader. gloo carries the small request messages on every device."""
    mine, leader = None, None
    rank = dist.get_rank()
    for ranks in groups:
        group = dist.new_group(ranks, backend="gloo")
        if rank in ranks:
            mine, leader = group, ranks[0]
    return mine, leader


class EngineGroupLeader:
    """The engine on tensor rank 0, seen by the agent loop: every ``generate_requests`` batch goes to the other
    ranks of the engine first. Everything else is the wrapped engine's."""

    def __init__(self, rollout: Any, group, leader_rank: int):
        self._rollout = rollout
        self._group = group
        self._leader = leader_rank

    def __getattr__(self, name: str):
        return getattr(self._rollout, name)

    def _send(self, payload) -> None:
        dist.broadcast_object_list([payload], src=self._leader, group=self._group)

    def generate_requests(self, requests: list) -> list:
        self._send([(list(r.prompt_ids), dict(r.params), r.request_id) for r in requests])
        return self._rollout.generate_requests(requests)

    def finish(self) -> None:
        """Tell the other ranks that this rollout is over (call once per rollout, also after an error)."""
        self._send(_DONE)


def follow_engine_leader(rollout: Any, group, leader_rank: int) -> int:
    """Run the leader's engine batches on this rank until it finishes; returns the number of batches run."""
    batches = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=leader_rank, group=group)
        if box[0] is _DONE:
            return batches
        rollout.generate_requests([RolloutRequest(prompt_ids=ids, params=params, request_id=rid)
                                   for ids, params, rid in box[0]])
        batches += 1
