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

A vLLM engine with data parallelism (``rollout.data_parallel_size = d``, for expert parallelism) adds one more
rule: its d data-parallel ranks run different requests but every forward together (the MoE layers exchange tokens
between them), so each of them must be inside an engine call whenever another one is; a rank without requests runs
empty steps. The request-level path meets it in rounds (:class:`EngineRound`): the d leaders of a replica agree in
each round whether any of them still has work; if so, each makes one engine call, with its own batch or an empty
one; when all are done, the rollout ends for all.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from .async_server import RolloutRequest

__all__ = ["EngineGroupLeader", "EngineRound", "follow_engine_leader", "new_engine_groups"]

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


_RUN, _FINISHED = "run", "finished"  # what a leader says at the start of a round


class EngineRound:
    """One data-parallel rank's engine (its leader, or the rollout itself with one tensor rank) as the agent loop
    sees it when the engine has data parallelism: every engine call is a round with the replica's other
    data-parallel leaders (see the module doc). ``group`` holds the replica's leaders; ``finish`` runs empty
    rounds until every leader has finished, then finishes the wrapped engine (its tensor ranks stop following)."""

    def __init__(self, engine: Any, group):
        self._engine = engine
        self._group = group
        self.rounds = 0  # engine calls made (own batches and empty ones), for tests and metrics

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def _agree(self, state: str) -> list:
        states = [None] * dist.get_world_size(self._group)
        dist.all_gather_object(states, state, group=self._group)
        return states

    def generate_requests(self, requests: list) -> list:
        self._agree(_RUN)
        self.rounds += 1
        return self._engine.generate_requests(requests)

    def finish(self) -> None:
        """Serve the other leaders' rounds with empty calls until all of them are done (call once per rollout)."""
        try:
            while _RUN in self._agree(_FINISHED):
                self.rounds += 1
                self._engine.generate_requests([])
        finally:
            finish = getattr(self._engine, "finish", None)
            if finish is not None:
                finish()
