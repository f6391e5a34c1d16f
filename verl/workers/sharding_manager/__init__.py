"""Weight handoff between the training engine and the rollout engine (the hybrid engine)."""

from .base import BaseShardingManager
from .fsdp_rollout import FSDPRolloutShardingManager

# verl's per-engine names: with one streaming interface, every engine uses the same manager.
FSDPVLLMShardingManager = FSDPRolloutShardingManager
FSDPSGLangShardingManager = FSDPRolloutShardingManager

__all__ = ["BaseShardingManager", "FSDPRolloutShardingManager", "FSDPVLLMShardingManager",
           "FSDPSGLangShardingManager"]
