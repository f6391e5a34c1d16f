"""Checks of the multi-turn / agent keys that must fail before any worker starts (tool config, loop names)."""

from __future__ import annotations

import logging

from verl.interactions.utils.interaction_registry import InteractionConfigError, check_interaction_config
from verl.tools.utils.tool_registry import ToolConfigError, check_tool_config
from verl.utils.config import ConfigError
from verl.utils.rollout_trace import missing_trace_package
from verl.workers.config.rollout import as_rollout_config

from .agent_loop import AGENT_LOOP_REGISTRY, load_agent_loop_config
from .tool_parser import ToolParser

__all__ = ["check_agent_loop_config"]

logger = logging.getLogger(__name__)
AR = "actor_rollout_ref.rollout"


def check_agent_loop_config(rollout_config, check_files: bool = True) -> None:
    """Raise ConfigError (naming the key) for a multi-turn setup that cannot run. ``rollout_config`` is the
    ``actor_rollout_ref.rollout`` section, typed (``RolloutConfig``) or as the yaml gives it.

    * ``multi_turn.enable`` / ``tool_config_path`` / ``agent.agent_loop_config_path`` need ``mode=async``;
    * the tool config must load and every ``class_name`` must import as a ``BaseTool`` subclass (interactions:
      a ``BaseInteraction`` subclass);
    * ``agent.default_agent_loop`` and ``multi_turn.format`` must name something registered;
    * ``trace.backend`` needs ``mode=async`` (the agent loop records the traces) and its packages (mlflow);
    * loops with a ``check_kwargs(kwargs, where)`` classmethod (the adapters that load a user file) check their
      agent-loop config entry (the default loop with no entry is checked with no kwargs).
    """
    rollout = as_rollout_config(rollout_config)
    mode, mt, agent = rollout.mode, rollout.multi_turn, rollout.agent
    enable, tool_path, interaction_path = mt.enable, mt.tool_config_path, mt.interaction_config_path
    loops_path = agent.agent_loop_config_path
    if rollout.trace.backend is not None:
        if mode != "async":
            raise ConfigError(f"{AR}.trace.backend={rollout.trace.backend} is set but {AR}.mode={mode}: the agent "
                              f"loop records the traces; set {AR}.mode=async")
        problem = missing_trace_package(rollout.trace.backend)
        if problem:
            raise ConfigError(problem)
    if mode != "async":
        for key, value in ((f"{AR}.multi_turn.enable", enable), (f"{AR}.multi_turn.tool_config_path", tool_path),
                           (f"{AR}.multi_turn.interaction_config_path", interaction_path),
                           (f"{AR}.agent.agent_loop_config_path", loops_path)):
            if value:
                raise ConfigError(f"{key} is set but {AR}.mode={mode}: multi-turn rollouts run in the agent loop; "
                                  f"set {AR}.mode=async")
        return
    if rollout.name == "sglang":
        raise ConfigError(f"{AR}.mode=async: the sglang rollout has no request-level API here; set {AR}.mode=sync "
                          f"or {AR}.name=vllm")
    if enable and not tool_path:
        logger.warning("%s.multi_turn.enable=True without a tool_config_path: tool_agent episodes will have no tools",
                       AR)
    if not check_files:
        return
    known = set(AGENT_LOOP_REGISTRY)
    loop_kwargs: dict[str, dict] = {}
    if loops_path:
        try:
            loop_kwargs = load_agent_loop_config(str(loops_path))
        except (FileNotFoundError, ValueError, ImportError, AttributeError) as exc:
            raise ConfigError(str(exc)) from None
        known |= set(loop_kwargs)
    default = agent.default_agent_loop
    if default not in known:
        raise ConfigError(f"{AR}.agent.default_agent_loop={default!r} is not a registered agent loop; use one of "
                          f"{sorted(known)} or list it in {AR}.agent.agent_loop_config_path")
    # loops that take a user file (openai_agent, openrlhf_agent) check it here, before any worker starts
    checks = dict(loop_kwargs)
    checks.setdefault(default, {})
    for loop_name, kwargs in checks.items():
        check = getattr(AGENT_LOOP_REGISTRY.get(loop_name), "check_kwargs", None)
        if check is None:
            continue
        where = (f"{AR}.agent.agent_loop_config_path={loops_path}: {loop_name}" if loop_name in loop_kwargs
                 else f"{AR}.agent.default_agent_loop={loop_name}")
        try:
            check(dict(kwargs), where)
        except (ValueError, FileNotFoundError, ImportError) as exc:
            raise ConfigError(str(exc)) from None
    try:
        ToolParser.get_tool_parser(mt.format, None)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if tool_path:
        try:
            check_tool_config(tool_path)
        except ToolConfigError as exc:
            raise ConfigError(str(exc)) from None
    if interaction_path:
        try:
            check_interaction_config(str(interaction_path))
        except InteractionConfigError as exc:
            raise ConfigError(str(exc)) from None
