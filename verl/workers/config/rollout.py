"""verl's rollout config classes, built on the schema's ``actor_rollout_ref.rollout`` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import verl.trainer.config_schema.rollout as schema
from verl.trainer.config_schema.spec import key, section
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config.base import CheckedSection

__all__ = ["SamplingConfig", "MultiTurnConfig", "CustomAsyncServerConfig", "AgentLoopConfig", "TraceConfig",
           "ServerConfig", "PrometheusConfig", "RolloutConfig", "as_rollout_config"]

IN_WORKER = "the rollout engine runs inside each worker (no separate server); leave the default"


@dataclass(frozen=True)
class SamplingConfig(schema.ValKwargs, CheckedSection):
    """Sampling parameters (``rollout.val_kwargs``: validation samples greedily by default)."""


@dataclass(frozen=True)
class MultiTurnConfig(schema.MultiTurn, CheckedSection):
    """``rollout.multi_turn``: tool calling in the agent loop."""


@dataclass(frozen=True)
class CustomAsyncServerConfig(schema.CustomAsyncServer, CheckedSection):
    """``rollout.agent.custom_async_server`` (accepted at its defaults)."""


@dataclass(frozen=True)
class AgentLoopConfig(schema.AgentConfig, CheckedSection):
    """``rollout.agent``: which agent loop runs a sample."""

    agent_loop_manager_class: Optional[str] = key(None, "a custom agent-loop manager class",
                                                  unsupported="the rollout workers run the agent loops themselves "
                                                              "(register loops with agent_loop_config_path); leave "
                                                              "null")
    custom_async_server: CustomAsyncServerConfig = section(CustomAsyncServerConfig)


@dataclass(frozen=True)
class TraceConfig(schema.TraceConfig, CheckedSection):
    """``rollout.trace`` (accepted at its defaults)."""


@dataclass(frozen=True)
class PrometheusConfig(schema.PrometheusConfig, CheckedSection):
    """``rollout.prometheus`` (accepted at its defaults)."""


@dataclass(frozen=True)
class ServerConfig(schema.ServerConfig, CheckedSection):
    """verl's SGLang server-mode client settings (``rollout.server``): accepted at any value, no effect here."""


@dataclass(frozen=True)
class RolloutConfig(schema.RolloutConfig, CheckedSection):
    """``actor_rollout_ref.rollout``: the sampling engine and its parameters (keys, defaults and ranges of the
    yaml)."""

    repetition_penalty: float = key(1.0, "penalty on repeated tokens", gt=0,
                                    unsupported="the rollout engines sample without a repetition penalty; leave 1.0")
    custom: Optional[dict] = key(None, "free-form settings of a custom rollout",
                                 unsupported="a registered rollout (register_rollout) reads the rollout's own keys; "
                                             "leave null")
    sglang_engine_mode: str = key("local", "local | server", unsupported=IN_WORKER)
    limit_images: Optional[int] = key(None, "images per prompt", ge=0,
                                      unsupported="every image of a prompt is passed to the engine; leave null")
    enable_sleep_mode: bool = key(True, "release the engine's memory between rollouts",
                                  unsupported="set free_cache_engine (releases the KV cache between rollouts)")
    layer_name_map: dict = key({}, "Megatron -> engine layer names for the weight push",
                               unsupported="the weight push maps names itself; leave it empty")
    server: ServerConfig = section(ServerConfig)
    trace: TraceConfig = section(TraceConfig)
    prometheus: PrometheusConfig = section(PrometheusConfig)
    multi_turn: MultiTurnConfig = section(MultiTurnConfig)
    agent: AgentLoopConfig = section(AgentLoopConfig)
    val_kwargs: SamplingConfig = section(SamplingConfig)


def as_rollout_config(config: Any) -> RolloutConfig:
    """``config`` as a :class:`RolloutConfig`: one passes through; the yaml's ``actor_rollout_ref.rollout`` section
    (a DictConfig or a mapping, None for all defaults) is built once, with the schema's default for every key it
    leaves out. Rollouts, the request server and the agent loops read their settings from the result."""
    if isinstance(config, RolloutConfig):
        return config
    return omega_conf_to_dataclass(config if config is not None else {}, RolloutConfig)
