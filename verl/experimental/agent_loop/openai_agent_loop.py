"""``openai_agent``: train an agent written against the OpenAI client, unchanged.

The user writes one async function::

    async def run_agent(client: openai.AsyncOpenAI, row: dict) -> float | None:
        reply = await client.chat.completions.create(model="policy", messages=row["raw_prompt"])
        ...
        return reward            # or None: the reward function scores the trajectory

and lists it in the agent-loop config (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: my_agent
      _target_: verl.experimental.agent_loop.OpenAIAgentLoop
      agent_func_path: /abs/path/my_agent.py      # a .py file, or pkg://package.module
      agent_func_name: run_agent                  # default

Rows with ``agent_name: my_agent`` then run it. ``client`` is an ``openai.AsyncOpenAI`` whose ``base_url`` is this
episode's session on the loopback endpoint (:mod:`.openai_endpoint`): the policy answers, and every token is
recorded (model tokens mask 1, messages the agent adds mask 0). ``row`` holds the row's fields (``raw_prompt``,
``reward_model``, ``extra_info``, ``data_source``, ...) as plain Python values. The model name in requests is not
checked. A number returned by the function is the episode's reward (``reward_score``); ``None`` leaves scoring to
the reward function. If the function raises, the episode keeps what was recorded, a warning is logged and
``agent_errors`` counts it; a request refused because the response budget is spent ends the episode normally.
"""

from __future__ import annotations

import inspect
import logging
import math
from typing import Any, Callable

import numpy as np

from verl.utils.config import omega_conf_to_dataclass
from verl.utils.import_utils import load_module
from verl.utils.rollout_trace import rollout_trace_op
from verl.workers.config.model import HFModelConfig

from .agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from .openai_endpoint import ChatSession, get_loopback_server
from .tool_parser import ToolParser

__all__ = ["OpenAIAgentLoop", "load_agent_func", "plain_row"]

logger = logging.getLogger(__name__)


def load_agent_func(path: Any, name: str = "run_agent", where: str = "openai_agent") -> Callable:
    """The ``async def name(client, row)`` in the file / module at ``path``; ValueError naming what is wrong."""
    if not path:
        raise ValueError(f"{where}: agent_func_path is required (the .py file that defines "
                         f"`async def {name}(client, row)`); set it in the agent-loop config entry")
    try:
        module = load_module(str(path))
    except (FileNotFoundError, ImportError, RuntimeError) as exc:
        raise ValueError(f"{where}: agent_func_path={path}: {exc}") from None
    func = getattr(module, str(name), None)
    if func is None:
        raise ValueError(f"{where}: agent_func_path={path} defines no {name!r}; define `async def {name}(client, "
                         f"row)` or set agent_func_name")
    if not inspect.iscoroutinefunction(func):
        raise ValueError(f"{where}: {path}:{name} must be an async function `async def {name}(client, row)`")
    if len(inspect.signature(func).parameters) < 2:
        raise ValueError(f"{where}: {path}:{name} must take (client, row)")
    return func


def plain_row(kwargs: dict) -> dict:
    """The row's fields as plain Python (numpy arrays from the batch become lists, numpy scalars numbers)."""

    def plain(value):
        if isinstance(value, np.ndarray):
            return [plain(v) for v in value.tolist()]
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return {k: plain(v) for k, v in kwargs.items()}


def reward_value(result: Any, where: str) -> float | None:
    """The agent function's return value as a reward (None: let the reward function score)."""
    if result is None:
        return None
    if hasattr(result, "item"):
        result = result.item()
    if isinstance(result, (bool, int, float)) and math.isfinite(float(result)):
        return float(result)
    raise ValueError(f"{where} returned {result!r}; return a finite number (the reward) or None")


@register("openai_agent")
class OpenAIAgentLoop(AgentLoopBase):
    """See the module docstring. Extra kwargs (agent-loop config entry): ``agent_func_path``,
    ``agent_func_name`` (default ``run_agent``), ``request_timeout`` (seconds per request, default 600)."""

    def __init__(self, trainer_config, server_manager, tokenizer, agent_func_path=None, agent_func_name="run_agent",
                 request_timeout: float = 600.0, **kwargs):
        super().__init__(trainer_config, server_manager, tokenizer, **kwargs)
        self.agent_func_name = str(agent_func_name)
        self.where = f"{agent_func_path}:{self.agent_func_name}"
        self.agent_func = load_agent_func(agent_func_path, self.agent_func_name)
        self.request_timeout = float(request_timeout)
        self.tool_parser = ToolParser.get_tool_parser(self.rollout_config.multi_turn.format, tokenizer)
        model = omega_conf_to_dataclass(self.config.actor_rollout_ref.model, HFModelConfig)
        model_path = str(model.path)
        self.model_name = model_path.rstrip("/").rsplit("/", 1)[-1] or "policy"
        self.endpoint = get_loopback_server()

    @classmethod
    def check_kwargs(cls, kwargs: dict, where: str) -> None:
        """Config check before workers start: the function loads and has the right shape."""
        load_agent_func(kwargs.get("agent_func_path"), str(kwargs.get("agent_func_name", "run_agent")), where)

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        session = ChatSession(self.tokenizer, self.server_manager, sampling_params, self.prompt_length,
                              self.response_length, tool_parser=self.tool_parser,
                              chat_template_kwargs=self.apply_chat_template_kwargs, model_name=self.model_name)
        # optional dependency: the OpenAI client is needed only when an openai_agent episode runs, not to register
        # the loop (so that trainers importing the agent-loop config do not need openai/httpx installed)
        import httpx
        import openai

        base_url = self.endpoint.open(session)
        http = httpx.AsyncClient(trust_env=False, timeout=self.request_timeout)  # loopback: never via a proxy
        client = openai.AsyncOpenAI(base_url=base_url, api_key="loopback", max_retries=0,
                                    timeout=self.request_timeout, http_client=http)
        reward, errors = None, 0
        try:
            reward = reward_value(await self.agent_func(client, plain_row(kwargs)), self.where)
        except Exception as exc:
            if not (session.exhausted and isinstance(exc, openai.BadRequestError)):
                errors = 1
                logger.warning("openai_agent %s raised %s: %s (the episode keeps its %d recorded requests)",
                               self.where, type(exc).__name__, exc, session.num_requests)
        finally:
            self.endpoint.close(session)
            await client.close()
            await http.aclose()
        traj = session.trajectory
        extra = {"chat_requests": session.num_requests, "chat_trajectories": session.num_trajectories,
                 "agent_errors": errors}
        metrics = AgentLoopMetrics(generate_sequences=session.generate_s)
        if traj is None:  # the agent made no request that was served: an empty response
            return AgentLoopOutput(prompt_ids=list(kwargs["raw_prompt_ids"]), response_ids=[], response_mask=[],
                                   response_logprobs=[], reward_score=reward, num_turns=1, metrics=metrics,
                                   extra_fields=extra)
        return AgentLoopOutput(prompt_ids=traj.prompt_ids, response_ids=traj.response_ids,
                               response_mask=traj.response_mask, response_logprobs=traj.response_logprobs,
                               reward_score=reward, num_turns=1 + traj.model_turns + traj.inserted_turns,
                               metrics=metrics, extra_fields=extra)
