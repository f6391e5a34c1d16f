"""``openrlhf_agent``: run an OpenRLHF agent file (``--agent_func_path``) as an agent loop.

OpenRLHF's multi-turn interface, which this adapter drives, is a file with a class ``AgentInstance`` (usually a
subclass of ``openrlhf.utils.agent.AgentInstanceBase``; a new instance per episode) with

* ``async reset(states) -> {"observation": str}``; ``states = {"observation": <prompt text>, "label": <label>}``;
* ``async step(states) -> {"rewards", "scores", "environment_feedback", "done", "sampling_params", "extra_logs"}``;
  ``states = {"observation_text", "action_text", "label", "sampling_params"}``.

Module-level ``async def reset(states)`` / ``async def step(states)`` are accepted too (one shared state for all
episodes of a worker). When OpenRLHF is not installed, ``openrlhf.utils.agent`` resolves to a stand-in that
provides ``AgentInstanceBase`` / ``AgentExecutorBase``, so such files import unchanged.

An episode: the prompt (the dataset's chat-templated prompt, or what ``reset`` returns) -> model turn (mask 1) ->
``step`` -> the environment feedback tokens (mask 0) -> model turn -> ... until ``done`` or the response budget
(``rollout.response_length``) is spent. Feedback returned together with ``done=True`` is not appended (no model
turn would follow it). The rewards of all steps add up to the episode's reward (``reward_score``), which replaces
the reward function's score; ``scores`` of the last step and ``extra_logs`` are kept per sample. ``label`` is the
row's ``reward_model.ground_truth`` (OpenRLHF's ``--label_key``), else its ``label`` field.

Config (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: my_env
      _target_: verl.experimental.agent_loop.OpenRLHFAgentLoop
      agent_func_path: /abs/path/agent_func.py
      max_tokens_per_turn: 256        # optional cap on each model turn (a step may lower it via sampling_params)
      max_turns: null                 # optional cap on model turns

A ``step`` that raises ends the episode (a warning, counted in ``env_errors``); a ``step`` result without
``rewards`` / ``environment_feedback`` / ``done`` is a bug in the file and raises a ValueError naming the key.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import math
import sys
import time
import types
from typing import Any, Optional
from uuid import uuid4

import numpy as np
import torch

from verl.utils.import_utils import load_module
from verl.utils.rollout_trace import rollout_trace_op

from .agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

__all__ = ["OpenRLHFAgentLoop", "AgentInstanceBase", "AgentExecutorBase", "load_openrlhf_agent"]

logger = logging.getLogger(__name__)

_INTERFACE = ("class AgentInstance with `async def reset(self, states, **kwargs)` -> {'observation': str} and "
              "`async def step(self, states, **kwargs)` -> {'rewards', 'scores', 'environment_feedback', 'done', ...}")


class AgentInstanceBase:
    """Stand-in for ``openrlhf.utils.agent.AgentInstanceBase`` when OpenRLHF is not installed."""

    def __init__(self, *args, **kwargs):
        pass

    async def reset(self, states: dict, **kwargs):
        return states

    async def step(self, states: dict, **kwargs):
        raise NotImplementedError("AgentInstance.step is not implemented")


class AgentExecutorBase:
    """Stand-in for ``openrlhf.utils.agent.AgentExecutorBase`` (files define a subclass; it is never run here)."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _provide_openrlhf_names() -> None:
    """Let ``from openrlhf.utils.agent import AgentInstanceBase, AgentExecutorBase`` work without OpenRLHF."""
    if "openrlhf" in sys.modules or importlib.util.find_spec("openrlhf") is not None:
        return  # the real package wins when it is installed
    root, utils, agent = (types.ModuleType(n) for n in ("openrlhf", "openrlhf.utils", "openrlhf.utils.agent"))
    agent.AgentInstanceBase, agent.AgentExecutorBase = AgentInstanceBase, AgentExecutorBase
    root.utils, utils.agent = utils, agent
    root.__path__, utils.__path__ = [], []
    sys.modules.update({"openrlhf": root, "openrlhf.utils": utils, "openrlhf.utils.agent": agent})


class _ModuleAgent:
    """Module-level ``reset`` / ``step`` functions behind the instance interface."""

    def __init__(self, module):
        self._reset, self._step = getattr(module, "reset", None), module.step

    async def reset(self, states: dict, **kwargs):
        if self._reset is None:
            return {"observation": states["observation"]}
        return await self._reset(states, **kwargs)

    async def step(self, states: dict, **kwargs):
        return await self._step(states, **kwargs)


class OpenRLHFAgentFile:
    """A loaded agent file: ``await new_instance()`` gives an object with async ``reset`` / ``step``."""

    def __init__(self, path: str, cls: Optional[type], module):
        self.path, self.cls, self.module = path, cls, module

    async def new_instance(self):
        if self.cls is None:
            return _ModuleAgent(self.module)
        if inspect.iscoroutinefunction(self.cls.__init__):  # some OpenRLHF examples declare `async def __init__`
            obj = self.cls.__new__(self.cls)
            await self.cls.__init__(obj)
            return obj
        return self.cls()


def load_openrlhf_agent(path: Any, where: str = "openrlhf_agent") -> OpenRLHFAgentFile:
    """Load and check an OpenRLHF agent file; ValueError naming the file and what is missing."""
    if not path:
        raise ValueError(f"{where}: agent_func_path is required (an OpenRLHF agent file: {_INTERFACE})")
    _provide_openrlhf_names()
    try:
        module = load_module(str(path))
    except (FileNotFoundError, ImportError, RuntimeError) as exc:
        raise ValueError(f"{where}: agent_func_path={path}: {exc}") from None
    cls = getattr(module, "AgentInstance", None)
    if not isinstance(cls, type):
        cls = None
    owner = cls if cls is not None else module
    step, reset = getattr(owner, "step", None), getattr(owner, "reset", None)
    what = "AgentInstance" if cls is not None else "the module"
    if step is None or (cls is not None and step is AgentInstanceBase.step):
        raise ValueError(f"{where}: agent_func_path={path}: {what} has no step(); expected an OpenRLHF agent "
                         f"file: {_INTERFACE} (module-level async reset/step functions work too)")
    for name, fn in (("step", step), ("reset", reset)):
        if fn is not None and not inspect.iscoroutinefunction(fn):
            raise ValueError(f"{where}: agent_func_path={path}: {what}.{name} must be `async def {name}(...)`")
    if cls is None and reset is None:
        logger.info("%s: %s has no reset(); the prompt is the first observation", where, path)
    return OpenRLHFAgentFile(str(path), cls, module)


def _number(value: Any, key: str, where: str) -> float:
    """A reward / score as a float: a number, or a one-element tensor / array (OpenRLHF uses tensors)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value, dtype=np.float64)
    if arr.size != 1 or not math.isfinite(float(arr.reshape(-1)[0])):
        raise ValueError(f"{where}: step() returned {key}={value!r}; expected one finite number")
    return float(arr.reshape(-1)[0])


@register("openrlhf_agent")
class OpenRLHFAgentLoop(AgentLoopBase):
    """See the module docstring."""

    def __init__(self, trainer_config, server_manager, tokenizer, agent_func_path=None, max_tokens_per_turn=None,
                 max_turns=None, **kwargs):
        super().__init__(trainer_config, server_manager, tokenizer, **kwargs)
        self.agent_file = load_openrlhf_agent(agent_func_path)
        self.where = str(agent_func_path)
        self.max_tokens_per_turn = int(max_tokens_per_turn) if max_tokens_per_turn else None
        self.max_turns = int(max_turns) if max_turns else None

    @classmethod
    def check_kwargs(cls, kwargs: dict, where: str) -> None:
        """Config check before workers start: the file loads and has the interface."""
        load_openrlhf_agent(kwargs.get("agent_func_path"), where)
        for key in ("max_tokens_per_turn", "max_turns"):
            value = kwargs.get(key)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{where}: {key}={value!r} must be a positive integer or null")

    @staticmethod
    def _label(kwargs: dict) -> Any:
        reward_model = kwargs.get("reward_model")
        if isinstance(reward_model, dict) and "ground_truth" in reward_model:
            return reward_model["ground_truth"]
        return kwargs.get("label")

    def _step_result(self, result: Any) -> dict:
        if not isinstance(result, dict):
            raise ValueError(f"{self.where}: step() must return a dict with rewards, environment_feedback and "
                             f"done; got {type(result).__name__}")
        for key in ("rewards", "environment_feedback", "done"):
            if key not in result:
                raise ValueError(f"{self.where}: step() result has no {key!r} (keys: {sorted(result)}); OpenRLHF's "
                                 f"step returns rewards, scores, environment_feedback, done")
        if not isinstance(result["environment_feedback"], str):
            raise ValueError(f"{self.where}: step() environment_feedback must be a string")
        return result

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        request_id = uuid4().hex
        label = self._label(kwargs)
        dataset_ids = list(kwargs["raw_prompt_ids"])
        prompt_text = self.tokenizer.decode(dataset_ids, skip_special_tokens=False)
        agent = await self.agent_file.new_instance()
        reset = await agent.reset({"observation": prompt_text, "label": label})
        observation = reset.get("observation", prompt_text) if isinstance(reset, dict) else prompt_text
        if not isinstance(observation, str):
            raise ValueError(f"{self.where}: reset() must return {{'observation': str}}, got {reset!r}")
        prompt_ids = dataset_ids if observation == prompt_text else self.tokenizer.encode(
            observation, add_special_tokens=False)
        response_ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        params = dict(sampling_params)
        turn_cap = self.max_tokens_per_turn
        total_reward, score, turns, feedback_turns, env_errors = 0.0, None, 0, 0, 0
        extra_logs: dict = {}
        gen_s = env_s = 0.0
        while True:
            budget = self.response_length - len(response_ids)
            if budget <= 0 or (self.max_turns and turns >= self.max_turns):
                break
            limit = min(budget, turn_cap) if turn_cap else budget
            start = time.perf_counter()
            out = await self.server_manager.generate(request_id, prompt_ids=prompt_ids + response_ids,
                                                     sampling_params=dict(params, max_tokens=limit))
            gen_s += time.perf_counter() - start
            ids = list(out.token_ids[:limit])
            response_ids += ids
            mask += [1] * len(ids)
            logprobs += list(out.log_probs[: len(ids)])
            turns += 1
            action_text = self.tokenizer.decode(ids, skip_special_tokens=True)
            start = time.perf_counter()
            try:
                result = await agent.step({"observation_text": observation, "action_text": action_text,
                                           "label": label, "sampling_params": dict(params, max_tokens=limit)})
            except Exception as exc:  # the environment failed: end the episode, keep what was sampled
                env_errors += 1
                logger.warning("openrlhf_agent %s: step() raised %s: %s; the episode ends", self.where,
                               type(exc).__name__, exc)
                break
            finally:
                env_s += time.perf_counter() - start
            result = self._step_result(result)
            total_reward += _number(result["rewards"], "rewards", self.where)
            score = _number(result["scores"], "scores", self.where) if result.get("scores") is not None else None
            extra_logs = {k: (_number(v, k, self.where) if isinstance(v, (torch.Tensor, np.ndarray)) else v)
                          for k, v in dict(result.get("extra_logs") or {}).items()}
            feedback = result["environment_feedback"]
            observation = observation + action_text + feedback
            new_params = result.get("sampling_params")
            if isinstance(new_params, dict) and new_params.get("max_tokens"):
                turn_cap = int(new_params["max_tokens"])
            if bool(result["done"]):
                break
            feedback_ids = self.tokenizer.encode(feedback, add_special_tokens=False) if feedback else []
            if len(response_ids) + len(feedback_ids) >= self.response_length:
                break  # no room for the feedback and another model turn
            response_ids += feedback_ids
            mask += [0] * len(feedback_ids)
            logprobs += [0.0] * len(feedback_ids)
            feedback_turns += 1
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=response_ids, response_mask=mask, response_logprobs=logprobs,
            reward_score=total_reward, num_turns=1 + turns + feedback_turns,
            metrics=AgentLoopMetrics(generate_sequences=gen_s, tool_calls=env_s),
            extra_fields={"env_steps": turns, "env_errors": env_errors,
                          "scores": score if score is not None else total_reward, "extra_logs": extra_logs})
