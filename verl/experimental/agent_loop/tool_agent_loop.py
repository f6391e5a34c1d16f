"""``tool_agent``: the model may call tools; their results are appended and the model continues.

One episode::

    prompt (chat template with the tool schemas)
    repeat:  model turn (mask 1)  ->  no tool call: done
                                  ->  calls: run them (at most max_parallel_calls), tool turn tokens (mask 0)

Keys (``actor_rollout_ref.rollout.multi_turn.*``): ``tool_config_path`` (the tools), ``max_assistant_turns`` /
``max_user_turns`` (null: no limit besides the response budget ``rollout.response_length``), ``max_parallel_calls``
(calls beyond it in one turn get an error message), ``max_tool_response_length`` (characters of one tool result;
cut on ``tool_response_truncate_side`` left|middle|right), ``format`` (tool-call syntax, ``hermes``).

Nothing a tool or the model does stops the episode with an exception: malformed call JSON, an unknown tool name,
a tool that raises, a tool that runs past its ``timeout`` (tool config) -- each becomes an ``Error: ...`` tool
message the model reads, and is counted in ``tool_errors``. A tool whose ``execute`` blocks the event loop with
synchronous work cannot be interrupted by the timeout: write tools as real coroutines (or use threads /
subprocesses, as the shipped sandbox does).

Row fields used: ``raw_prompt`` (chat messages; needs ``data.return_raw_chat=True``, else the dataset's prompt
tokens are used as they are), ``tools_kwargs`` (``{tool_name: {create_kwargs: {...}}}``, from
``extra_info.tools_kwargs``), ``interaction_kwargs`` (``{name: <interaction>, ...}``: with
``multi_turn.interaction_config_path`` set, a model turn without tool calls goes to that simulated user, whose reply
becomes a user turn (mask 0) unless it ends the episode; its scores are kept in ``turn_scores``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Optional
from uuid import uuid4

from verl.interactions.utils.interaction_registry import initialize_interactions_from_config
from verl.tools.utils.tool_registry import initialize_tools_from_config, tool_schemas
from verl.utils.rollout_trace import rollout_trace_op

from .agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from .tool_parser import ToolParser

__all__ = ["ToolAgentLoop", "truncate_text"]

logger = logging.getLogger(__name__)

_PLACEHOLDER = "\u2063VERL_ASSISTANT_TURN\u2063"  # an assistant text no model writes, to locate turn boundaries
_TOOLS_CACHE: dict[str, list] = {}  # tool config path -> tools (built once per process)
_INTERACTIONS_CACHE: dict[str, dict] = {}  # interaction config path -> {name: interaction}


def truncate_text(text: str, limit: int, side: str = "middle") -> str:
    """Cut ``text`` to about ``limit`` characters, keeping the start (right), the end (left) or both (middle)."""
    if limit <= 0 or len(text) <= limit:
        return text
    marker = "...(truncated)..."
    if side == "left":
        return marker + text[-limit:]
    if side == "right":
        return text[:limit] + marker
    if side == "middle":
        head = limit // 2
        return text[:head] + marker + text[len(text) - (limit - head):]
    raise ValueError(f"actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side={side!r}: use left, middle "
                     f"or right")


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """See the module docstring."""

    def __init__(self, trainer_config, server_manager, tokenizer, **kwargs):
        super().__init__(trainer_config, server_manager, tokenizer, **kwargs)
        mt = self.rollout_config.multi_turn
        self.max_assistant_turns = mt.max_assistant_turns
        self.max_user_turns = mt.max_user_turns
        self.max_parallel_calls = mt.max_parallel_calls
        self.max_tool_response_length = mt.max_tool_response_length
        self.truncate_side = mt.tool_response_truncate_side
        truncate_text("", 0, self.truncate_side)  # checks the side name now, not in the middle of a rollout
        path = mt.tool_config_path
        key = str(path) if path else ""
        if key not in _TOOLS_CACHE:
            _TOOLS_CACHE[key] = initialize_tools_from_config(path) if path else []
        self.tools = {tool.name: tool for tool in _TOOLS_CACHE[key]}
        self.tool_schemas = tool_schemas(list(self.tools.values())) or None
        self.tool_parser = ToolParser.get_tool_parser(mt.format, tokenizer)
        ipath = mt.interaction_config_path
        ikey = str(ipath) if ipath else ""
        if ikey not in _INTERACTIONS_CACHE:
            _INTERACTIONS_CACHE[ikey] = initialize_interactions_from_config(ipath) if ipath else {}
        self.interactions = _INTERACTIONS_CACHE[ikey]
        self._eos_text = self._eos_string()

    def _eos_string(self) -> str:
        eos = getattr(self.tokenizer, "eos_token", None)
        return eos if isinstance(eos, str) else ""

    # ------------------------------------------------------------------------------------ tokens of a tool turn
    def tool_turn_ids(self, tool_messages: list[dict], response_ended_with_eos: bool) -> list[int]:
        """The tokens the chat template puts between the end of the model's turn and the start of its next turn
        (the tool or user messages and the next assistant header), found by rendering a placeholder conversation."""
        head = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _PLACEHOLDER}]
        kwargs = dict(self.apply_chat_template_kwargs)
        full = self.tokenizer.apply_chat_template(head + tool_messages, tools=self.tool_schemas, tokenize=False,
                                                  add_generation_prompt=True, **kwargs)
        cut = full.index(_PLACEHOLDER) + len(_PLACEHOLDER)
        delta = full[cut:]
        if response_ended_with_eos and self._eos_text and delta.startswith(self._eos_text):
            delta = delta[len(self._eos_text):]  # the model already produced the end-of-turn token
        return self.tokenizer.encode(delta, add_special_tokens=False)

    # ---------------------------------------------------------------------------------------------- tools
    @rollout_trace_op
    async def _call_tool(self, call, tools_kwargs: dict, instances: dict) -> tuple[str, bool, float]:
        """Run one parsed call; returns (text for the model, error?, tool reward)."""
        tool = self.tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted(self.tools)) or "none"
            return f"Error: unknown tool '{call.name}'; available tools: {names}", True, 0.0
        try:
            args = json.loads(call.arguments)
            if call.name not in instances:
                create_kwargs = (tools_kwargs.get(call.name) or {}).get("create_kwargs", {}) or {}
                instances[call.name], _ = await asyncio.wait_for(tool.create(create_kwargs=create_kwargs),
                                                                 timeout=tool.timeout)
            response, reward, metrics = await asyncio.wait_for(tool.execute(instances[call.name], args),
                                                               timeout=tool.timeout)
        except asyncio.TimeoutError:
            return f"Error: tool '{call.name}' did not finish within {tool.timeout:g} s", True, 0.0
        except Exception as exc:  # a tool bug becomes a message to the model, never a crashed rollout
            logger.warning("tool %s raised %s: %s", call.name, type(exc).__name__, exc)
            return f"Error: tool '{call.name}' failed: {type(exc).__name__}: {exc}", True, 0.0
        text = response.text if response is not None and response.text is not None else ""
        failed = bool((metrics or {}).get("error", 0))
        return truncate_text(text, self.max_tool_response_length, self.truncate_side), failed, float(reward or 0.0)

    async def _release(self, instances: dict) -> float:
        total = 0.0
        for name, instance_id in instances.items():
            tool = self.tools[name]
            try:
                total += float(await asyncio.wait_for(tool.calc_reward(instance_id), timeout=tool.timeout) or 0.0)
                await asyncio.wait_for(tool.release(instance_id), timeout=tool.timeout)
            except Exception as exc:
                logger.warning("tool %s: calc_reward/release raised %s: %s", name, type(exc).__name__, exc)
        return total

    # ---------------------------------------------------------------------------------------------- episode
    def _prompt_ids(self, kwargs: dict) -> list[int]:
        raw_prompt = kwargs.get("raw_prompt")
        if raw_prompt is not None:
            messages = [dict(m) for m in list(raw_prompt)]
            return self.apply_chat_template(messages, tools=self.tool_schemas)
        return list(kwargs["raw_prompt_ids"])

    async def _start_interaction(self, kwargs: dict):
        """(interaction, instance id) for a row whose ``interaction_kwargs.name`` names a configured one."""
        ikw = dict(kwargs.get("interaction_kwargs") or {})
        name = ikw.pop("name", None)
        if not name or not self.interactions:
            return None, None
        interaction = self.interactions.get(str(name))
        if interaction is None:
            logger.warning("interaction_kwargs.name=%r is not in the interaction config (%s); no simulated user",
                           name, sorted(self.interactions))
            return None, None
        return interaction, await interaction.start_interaction(None, **ikw)

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        request_id = uuid4().hex
        tools_kwargs = dict(kwargs.get("tools_kwargs") or {})
        prompt_ids = self._prompt_ids(kwargs)
        response_ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        assistant_turns = user_turns = num_calls = num_errors = 0
        step_reward = 0.0
        gen_s = tool_s = 0.0
        instances: dict[str, str] = {}
        eos_ids = set(_as_list(getattr(self.tokenizer, "eos_token_id", None)))
        messages = [dict(m) for m in list(kwargs.get("raw_prompt") or [])]
        interaction, interaction_id = await self._start_interaction(kwargs)
        turn_scores: list[float] = []
        try:
            while True:
                budget = self.response_length - len(response_ids)
                if budget <= 0:
                    break
                start = time.perf_counter()
                out = await self.server_manager.generate(request_id, prompt_ids=prompt_ids + response_ids,
                                                         sampling_params=dict(sampling_params, max_tokens=budget))
                gen_s += time.perf_counter() - start
                ids = out.token_ids[:budget]
                response_ids += ids
                mask += [1] * len(ids)
                logprobs += list(out.log_probs[: len(ids)])
                assistant_turns += 1
                if len(response_ids) >= self.response_length or out.finish_reason == "length":
                    break
                if self.max_assistant_turns and assistant_turns >= int(self.max_assistant_turns):
                    break
                content, calls, errors = self.tool_parser.parse(self.tokenizer.decode(ids, skip_special_tokens=True))
                messages.append({"role": "assistant", "content": content})
                if not calls and not errors:
                    if interaction is None:
                        break  # a final answer
                    done, reply, score, _ = await interaction.generate_response(interaction_id, messages)
                    turn_scores.append(float(score))
                    if done:
                        break
                    user = [{"role": "user", "content": reply}]
                    user_ids = self.tool_turn_ids(user, bool(ids) and ids[-1] in eos_ids)
                    if len(response_ids) + len(user_ids) >= self.response_length:
                        break
                    response_ids += user_ids
                    mask += [0] * len(user_ids)
                    logprobs += [0.0] * len(user_ids)
                    messages += user
                    user_turns += 1
                    if self.max_user_turns and user_turns >= int(self.max_user_turns):
                        break
                    continue
                start = time.perf_counter()
                texts = [f"Error: {e.message}" for e in errors]
                run_now, refused = calls[: self.max_parallel_calls], calls[self.max_parallel_calls:]
                results = await asyncio.gather(*[self._call_tool(c, tools_kwargs, instances) for c in run_now])
                texts += [text for text, _, _ in results]
                texts += [f"Error: at most {self.max_parallel_calls} tool call(s) per turn; '{c.name}' was not run"
                          for c in refused]
                num_calls += len(calls) + len(errors)
                num_errors += len(errors) + len(refused) + sum(int(failed) for _, failed, _ in results)
                step_reward += sum(r for _, _, r in results)
                tool_s += time.perf_counter() - start
                tool_messages = [{"role": "tool", "content": t} for t in texts]
                messages += tool_messages
                tool_ids = self.tool_turn_ids(tool_messages, bool(ids) and ids[-1] in eos_ids)
                if len(response_ids) + len(tool_ids) >= self.response_length:
                    break  # no room for the results and another model turn
                response_ids += tool_ids
                mask += [0] * len(tool_ids)
                logprobs += [0.0] * len(tool_ids)
                user_turns += 1
                if self.max_user_turns and user_turns >= int(self.max_user_turns):
                    break
        finally:
            final_reward = await self._release(instances)
            if interaction is not None:
                await interaction.finalize_interaction(interaction_id)
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=response_ids, response_mask=mask, response_logprobs=logprobs,
            num_turns=assistant_turns + user_turns + 1,
            metrics=AgentLoopMetrics(generate_sequences=gen_s, tool_calls=tool_s),
            extra_fields={"tool_calls": num_calls, "tool_errors": num_errors,
                          "tool_rewards": step_reward + final_reward, "turn_scores": turn_scores})


def _as_list(value: Optional[Any]) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
