"""verl's FSDP worker module path: the role workers of :mod:`verl.workers.engine_workers`, which run the FSDP2
engine (and any engine registered for these workers)."""

from verl.workers.engine_workers import (ActorRolloutRefWorker, AsyncActorRolloutRefWorker, CriticWorker,
                                         RewardModelWorker, push_bucket_bytes)

__all__ = ["ActorRolloutRefWorker", "AsyncActorRolloutRefWorker", "CriticWorker", "RewardModelWorker",
           "push_bucket_bytes"]
