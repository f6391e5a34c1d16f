"""verl's critic config classes, built on the schema's ``critic`` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import verl.trainer.config_schema.critic as schema
from verl.trainer.config_schema.spec import key, section
from verl.workers.config.actor import _CheckedCheckpointConfig
from verl.workers.config.base import CheckedSection, rekey
from verl.workers.config.engine import FSDPEngineConfig, McoreEngineConfig
from verl.workers.config.optimizer import CriticFSDPOptimizerConfig, CriticMcoreOptimizerConfig

__all__ = ["CriticConfig", "FSDPCriticConfig", "McoreCriticConfig", "FSDPCriticModelCfg"]

VALUE_PASS = ("the critic's value pass is sized by critic.forward_micro_batch_size_per_gpu / "
              "forward_max_token_len_per_gpu; leave the default")


@dataclass(frozen=True)
class FSDPCriticModelCfg(schema.CriticModelConfig, CheckedSection):
    """``critic.model``: the value model checkpoint and how the FSDP engine shards it."""

    lora: dict = key({}, "Megatron LoRA settings of the value model",
                     unsupported="the critic trains all its parameters here (LoRA on the critic is not available); "
                                 "leave it empty")
    fsdp_config: FSDPEngineConfig = section(FSDPEngineConfig)


@dataclass(frozen=True)
class CriticConfig(schema.CriticConfig, CheckedSection):
    """``critic``: the value model's PPO update (keys, defaults and ranges of the yaml).

    ``engine`` is the engine section of the strategy (``model.fsdp_config``, or ``megatron``)."""

    ppo_infer_micro_batch_size_per_gpu: Optional[int] = key(None, "rows per micro-batch of the value pass", ge=1,
                                                            unsupported=VALUE_PASS)
    ppo_infer_max_token_len_per_gpu: int = key(32768, "token budget of the value pass", ge=1, unsupported=VALUE_PASS)
    nccl_timeout: int = key(600, "process-group timeout in seconds", gt=0,
                            unsupported="the process group uses torch's default timeout here; leave 600")
    load_weight: bool = key(True, "load the checkpoint's weights",
                            unsupported="the weights always load from critic.model.path; leave true")
    model_config: Any = None
    checkpoint: _CheckedCheckpointConfig = section(_CheckedCheckpointConfig)
    optim: CriticFSDPOptimizerConfig = section(CriticFSDPOptimizerConfig)
    model: FSDPCriticModelCfg = section(FSDPCriticModelCfg)
    megatron: McoreEngineConfig = section(McoreEngineConfig, optional=True)

    @property
    def engine(self) -> Any:
        """The engine section of the critic's strategy."""
        return self.megatron if self.strategy == "megatron" else self.model.fsdp_config


@dataclass(frozen=True)
class FSDPCriticConfig(CriticConfig):
    """The critic on the FSDP engine."""


@dataclass(frozen=True)
class McoreCriticConfig(CriticConfig):
    """The critic on the Megatron engine (strategy=megatron; ``megatron`` holds the parallel sizes)."""

    strategy: str = rekey(schema.CriticConfig, "strategy", "megatron")
    optim: CriticMcoreOptimizerConfig = section(CriticMcoreOptimizerConfig)
