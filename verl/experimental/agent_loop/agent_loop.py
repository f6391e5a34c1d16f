"""The agent loop: episodes that talk to the rollout engine request by request (verl's names and signatures).

An *agent loop* turns one dataset row into one trajectory. It is a subclass of :class:`AgentLoopBase` with an
async ``run(sampling_params, **row_fields) -> AgentLoopOutput``; inside, it renders messages to token ids, asks
``self.server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` for a continuation (token ids
+ log-probs), calls tools or a simulated user, appends their tokens, and repeats. The row's ``agent_name`` field
picks the loop (``rollout.agent.default_agent_loop`` when the row has none); built-ins are ``single_turn_agent``
and ``tool_agent``; a user registers more with ``@register("name")`` or a yaml list at
``rollout.agent.agent_loop_config_path`` (``- name: my_agent`` / ``_target_: pkg.module.MyAgentLoop`` / kwargs).

:class:`AgentLoopWorker` is what the rollout worker runs for ``rollout.mode=async``: for a batch of prompts it
starts every episode (``rollout.n`` per prompt) as an asyncio task on one event loop, so all episodes of the
worker progress concurrently and share engine calls (see ``verl.workers.rollout.async_server``), and packs the
outputs into the batch layout of ``generate_sequences`` plus:

``response_mask``  1 on tokens the model sampled, 0 on tool / user tokens inside the response (they get no loss)
``rollout_log_probs``  the engine's log-prob of every sampled token (0 on tool / user tokens)
``__num_turns__``, ``__tool_calls__``, ``__tool_errors__``, ``__tool_rewards__``, ``__turn_scores__``  per-sample
values (non-tensor fields, for metrics); anything else a loop puts in ``extra_fields`` is in ``__extra_fields__``
``__reward_score__``  the loop's ``reward_score`` (None when it has none); the reward manager uses it in place of
the reward function's score for that sample
"""

from __future__ import annotations

import asyncio
import logging
import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Optional
from uuid import uuid4

import numpy as np
import torch
from omegaconf import OmegaConf
from pydantic import BaseModel, ConfigDict, Field

from verl.utils.import_utils import load_module
from verl.utils.rollout_trace import (RolloutTraceConfig, rollout_trace_attr, rollout_trace_op, trainer_run_names,
                                      traced_samples)
from verl.workers.config.data import as_data_config
from verl.workers.config.rollout import as_rollout_config
from verl.workers.rollout.async_server import AsyncRolloutServer, TokenOutput
from verl.workers.rollout.utils import sampling_params_for

if TYPE_CHECKING:  # annotations only; DataProto is imported where a batch is packed
    from verl.protocol import DataProto

__all__ = ["AgentLoopBase", "AgentLoopOutput", "AgentLoopMetrics", "AsyncLLMServerManager", "AgentLoopWorker",
           "register", "get_agent_loop_class", "load_agent_loop_config", "AGENT_LOOP_REGISTRY"]

logger = logging.getLogger(__name__)

AGENT_LOOP_REGISTRY: dict[str, type] = {}


def register(agent_name: str):
    """Class decorator: make an :class:`AgentLoopBase` subclass selectable by ``agent_name``."""

    def decorator(cls):
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise TypeError(f"@register({agent_name!r}) needs an AgentLoopBase subclass, got {cls!r}")
        AGENT_LOOP_REGISTRY[agent_name] = cls
        return cls

    return decorator


def get_agent_loop_class(agent_name: str) -> type:
    try:
        return AGENT_LOOP_REGISTRY[agent_name]
    except KeyError:
        raise KeyError(f"unknown agent_name {agent_name!r}; registered: {sorted(AGENT_LOOP_REGISTRY)}") from None


def load_agent_loop_config(path: str) -> dict[str, dict]:
    """Register the loops listed at ``rollout.agent.agent_loop_config_path``; returns name -> extra kwargs."""
    where = f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}"
    if not os.path.isfile(os.path.expanduser(path)):
        raise FileNotFoundError(f"{where}: no such file")
    entries = OmegaConf.to_container(OmegaConf.load(os.path.expanduser(path)), resolve=True)
    if not isinstance(entries, list):
        raise ValueError(f"{where}: expected a list of {{name, _target_, ...kwargs}}")
    kwargs_by_name = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("_target_"):
            raise ValueError(f"{where}: entry {i} needs 'name' and '_target_' (pkg.module.Class)")
        module_name, _, attr = str(entry["_target_"]).rpartition(".")
        cls = getattr(load_module(module_name), attr, None)
        if cls is None:
            raise ValueError(f"{where}: entry {i}: {entry['_target_']} not found")
        register(str(entry["name"]))(cls)
        kwargs_by_name[str(entry["name"])] = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
    return kwargs_by_name


# per-sample fields every packed batch carries (as ``__name__`` non-tensor columns), with their defaults
_STANDARD_FIELDS = {"tool_calls": 0, "tool_errors": 0, "tool_rewards": 0.0, "turn_scores": [], "reward_score": None}


class AgentLoopMetrics(BaseModel):
    """Per-episode timings (seconds) and counts."""

    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    num_preempted: int = -1


class AgentLoopOutput(BaseModel):
    """One trajectory, token in / token out."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]  # 1: sampled by the model; 0: tool / user tokens
    response_logprobs: Optional[list[float]] = None
    multi_modal_data: Optional[dict[str, Any]] = None
    reward_score: Optional[float] = None
    num_turns: int = 0
    metrics: AgentLoopMetrics = Field(default_factory=AgentLoopMetrics)
    extra_fields: dict[str, Any] = Field(default_factory=dict)


class AsyncLLMServerManager:
    """What an agent loop calls: ``await generate(request_id, prompt_ids=..., sampling_params=...)``.

    Here it fronts the worker's own engine (:class:`AsyncRolloutServer`); the ``request_id`` of an episode stays
    the same across its turns. ``tokenizer``: decodes the recorded outputs under ``rollout.trace.token2text``."""

    def __init__(self, server: AsyncRolloutServer, tokenizer=None):
        self.server = server
        self.tokenizer = tokenizer

    @rollout_trace_op
    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Optional[list] = None) -> TokenOutput:
        if image_data:
            raise NotImplementedError("image inputs are not supported by this rollout")
        return await self.server.generate(prompt_ids, sampling_params, request_id)


class _TrainerConfig:
    """verl hands agent loops a wrapper whose ``.config`` is the full config; here it holds ``actor_rollout_ref``."""

    def __init__(self, actor_rollout_ref_config):
        self.config = OmegaConf.create({"actor_rollout_ref": actor_rollout_ref_config})


class AgentLoopBase(ABC):
    """Base class of agent loops (see the module docstring).

    Args (verl's): ``trainer_config`` (``.config.actor_rollout_ref`` is the policy config), ``server_manager``
    (:class:`AsyncLLMServerManager`), ``tokenizer``, ``processor``, ``dataset_cls``, ``dataset_config``.
    """

    def __init__(self, trainer_config, server_manager: AsyncLLMServerManager, tokenizer, processor=None,
                 dataset_cls=None, dataset_config=None, **kwargs):
        self.config = trainer_config.config
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.dataset_config = dataset_config
        self.rollout_config = as_rollout_config(self.config.actor_rollout_ref.rollout)
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length
        # verl passes the ``data`` section (None: every key at its default)
        self.apply_chat_template_kwargs = dict(as_data_config(dataset_config).apply_chat_template_kwargs)

    def apply_chat_template(self, messages: list[dict], tools: Optional[list[dict]] = None,
                            add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` rendered with the tokenizer's chat template (tool schemas included)."""
        text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False, **self.apply_chat_template_kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """Run one episode; ``kwargs`` are the row's non-tensor fields (``raw_prompt``, ``tools_kwargs``, ...)
        plus ``raw_prompt_ids`` (the dataset's prompt tokens)."""


class AgentLoopWorker:
    """Runs a batch of episodes concurrently and packs them into the rollout batch layout (module docstring).

    Args:
        config: the ``actor_rollout_ref`` config.
        rollout: the worker's engine (a ``BaseRollout`` with ``generate_requests``).
        tokenizer: the policy tokenizer.
        run_names: (``trainer.project_name``, ``trainer.experiment_name``), where ``rollout.trace`` records the
            episodes (verl.utils.rollout_trace); by default read from the whole config ``config`` belongs to.
    """

    def __init__(self, config, rollout, tokenizer, processor=None, dataset_config=None,
                 run_names: Optional[tuple[str, str]] = None):
        self.config = config
        self.rollout_config = as_rollout_config(config.rollout)
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_config = dataset_config
        self.server = AsyncRolloutServer(rollout, self.rollout_config)
        self.server_manager = AsyncLLMServerManager(self.server, tokenizer)
        self.trainer_config = _TrainerConfig(config)
        self.default_agent = self.rollout_config.agent.default_agent_loop
        self.agent_kwargs: dict[str, dict] = {}
        path = self.rollout_config.agent.agent_loop_config_path
        if path:
            self.agent_kwargs = load_agent_loop_config(str(path))
        self._loops: dict[str, AgentLoopBase] = {}
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length
        trace = self.rollout_config.trace
        RolloutTraceConfig.init(*(run_names or trainer_run_names(config)), trace.backend, trace.token2text,
                                trace.max_samples_per_step_per_worker)

    def _loop_for(self, name: str) -> AgentLoopBase:
        if name not in self._loops:
            cls = get_agent_loop_class(name)
            self._loops[name] = cls(trainer_config=self.trainer_config, server_manager=self.server_manager,
                                    tokenizer=self.tokenizer, processor=self.processor,
                                    dataset_config=self.dataset_config, **self.agent_kwargs.get(name, {}))
        return self._loops[name]

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``rollout.n`` episodes per prompt (interleaved rows, like the batch engines)."""
        meta = dict(prompts.meta_info)
        params = sampling_params_for(self.rollout_config, meta)
        n = int(params.pop("n"))
        sampling = dict(params)
        if self.rollout_config.ignore_eos:
            sampling["ignore_eos"] = True
        outputs, unknown = asyncio.run(self._run_all(prompts, sampling, n))
        RolloutTraceConfig.flush(wait=False)  # the step's traces into the store (rollout.trace.backend)
        return self._pack(outputs, unknown, prompts, n, meta)

    def _episode_kwargs(self, prompts: DataProto, i: int) -> dict:
        kwargs = {k: v[i] for k, v in prompts.non_tensor_batch.items()}
        if "raw_prompt_ids" not in kwargs or kwargs["raw_prompt_ids"] is None:
            ids, mask = prompts.batch["input_ids"][i], prompts.batch["attention_mask"][i]
            kwargs["raw_prompt_ids"] = ids[mask.bool()].tolist()
        kwargs["raw_prompt_ids"] = [int(t) for t in kwargs["raw_prompt_ids"]]
        return kwargs

    async def _run_all(self, prompts: DataProto, sampling: dict, n: int):
        tasks, unknown = [], []
        names = prompts.non_tensor_batch.get("agent_name")
        index = prompts.non_tensor_batch.get("index")
        sample_ids = list(index) if index is not None else list(range(len(prompts)))
        step, validate = prompts.meta_info.get("global_steps", -1), bool(prompts.meta_info.get("validate", False))
        traced = traced_samples(sample_ids, step)  # None: every episode (rollout.trace.*)
        rollouts: dict = {}  # sample id -> rollouts started (validation repeats a sample's rows instead of n)
        for i in range(len(prompts)):
            name = names[i] if names is not None and names[i] else self.default_agent
            if name not in AGENT_LOOP_REGISTRY:
                logger.warning("unknown agent_name %r in the data (registered: %s); running %s instead", name,
                               sorted(AGENT_LOOP_REGISTRY), self.default_agent)
                name = self.default_agent
                unknown.append(1)
            else:
                unknown.append(0)
            loop = self._loop_for(str(name))
            kwargs = self._episode_kwargs(prompts, i)
            first = rollouts.get(sample_ids[i], 0)
            rollouts[sample_ids[i]] = first + n
            for j in range(n):
                trace = dict(step=step, sample_index=sample_ids[i], rollout_n=first + j, validate=validate,
                             trace=traced is None or sample_ids[i] in traced)
                tasks.append(self._run_episode(loop, dict(sampling), dict(kwargs), trace))
        return await asyncio.gather(*tasks), unknown

    @staticmethod
    async def _run_episode(loop: AgentLoopBase, sampling: dict, kwargs: dict, trace: dict) -> AgentLoopOutput:
        with rollout_trace_attr(name="agent_loop", **trace):  # one trace per episode with a rollout.trace.backend
            return await loop.run(sampling, **kwargs)

    def _pack(self, outputs: list[AgentLoopOutput], unknown: list[int], prompts: DataProto, n: int,
              meta: dict) -> DataProto:
        P, R = self.prompt_length, self.response_length
        pad_id = meta.get("pad_token_id", getattr(self.tokenizer, "pad_token_id", 0))
        pad_id = int(pad_id if pad_id is not None else 0)
        rows = len(outputs)
        prompt_ids = torch.full((rows, P), pad_id, dtype=torch.long)
        prompt_attn = torch.zeros((rows, P), dtype=torch.long)
        responses = torch.full((rows, R), pad_id, dtype=torch.long)
        response_attn = torch.zeros((rows, R), dtype=torch.long)
        response_mask = torch.zeros((rows, R), dtype=torch.long)
        logps = torch.zeros((rows, R), dtype=torch.float32)
        num_turns = np.zeros(rows, dtype=np.int64)
        extra: dict[str, list] = {}
        for row, out in enumerate(outputs):
            if len(out.prompt_ids) > P:
                raise ValueError(f"an agent loop's prompt is {len(out.prompt_ids)} tokens, more than "
                                 f"actor_rollout_ref.rollout.prompt_length={P} (data.max_prompt_length): tool "
                                 f"schemas in the chat template add tokens; raise data.max_prompt_length")
            if not (len(out.response_ids) == len(out.response_mask)):
                raise ValueError(f"agent loop output: {len(out.response_ids)} response_ids but "
                                 f"{len(out.response_mask)} response_mask entries")
            k = min(len(out.response_ids), R)
            prompt_ids[row, P - len(out.prompt_ids):] = torch.tensor(out.prompt_ids, dtype=torch.long)
            prompt_attn[row, P - len(out.prompt_ids):] = 1
            if k:
                responses[row, :k] = torch.tensor(out.response_ids[:k], dtype=torch.long)
                response_attn[row, :k] = 1
                response_mask[row, :k] = torch.tensor(out.response_mask[:k], dtype=torch.long)
                if out.response_logprobs is not None:
                    logps[row, :k] = torch.tensor(out.response_logprobs[:k], dtype=torch.float32)
            logps[row] *= response_mask[row].float()
            num_turns[row] = out.num_turns
            # the same columns on every rank (the batch is concatenated across workers): the standard fields, and
            # whatever else a loop reports in one dict per sample
            fields = dict(out.extra_fields)
            packed = {key: fields.pop(key, default) for key, default in _STANDARD_FIELDS.items()}
            if out.reward_score is not None:  # the loop's own reward (an environment's): replaces the reward fn's
                packed["reward_score"] = float(out.reward_score)
            packed.update(unknown_agent=unknown[row // n], generate_s=out.metrics.generate_sequences,
                          tool_s=out.metrics.tool_calls, extra_fields=fields)
            for key, value in packed.items():
                extra.setdefault(key, []).append(value)
        attention_mask = torch.cat([prompt_attn, response_attn], dim=-1)
        position_ids = torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
        batch = {"prompts": prompt_ids, "responses": responses, "input_ids": torch.cat([prompt_ids, responses], -1),
                 "attention_mask": attention_mask, "position_ids": position_ids, "response_mask": response_mask,
                 "rollout_log_probs": logps}
        non_tensor = {"__num_turns__": num_turns}
        for key, values in extra.items():
            arr = np.empty(rows, dtype=object)
            for i, v in enumerate(values):
                arr[i] = v
            non_tensor[f"__{key}__"] = arr
        meta.setdefault("eos_token_id", getattr(self.tokenizer, "eos_token_id", None))
        meta.setdefault("pad_token_id", pad_id)
        from verl.protocol import DataProto  # here: the driver imports the registry without tensordict

        return DataProto.from_dict(tensors=batch, non_tensors=non_tensor, meta_info=meta)


def new_request_id() -> str:
    return uuid4().hex
