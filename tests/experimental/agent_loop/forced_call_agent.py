"""An agent loop for end-to-end tests: every episode opens with a scripted calculator call (tokens with mask 0,
as if written by someone else), the tool runs for real, and the model then takes its turn like ``tool_agent``.
An untrained tiny model never writes a tool call itself; this puts real tool turns into a training run."""

from __future__ import annotations

import time
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.tools.schemas import OpenAIFunctionParsedSchema


class ForcedCallAgentLoop(ToolAgentLoop):
    async def run(self, sampling_params, **kwargs):
        prompt_ids = self._prompt_ids(kwargs)
        expression = "12*34"
        call_text = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expression
        call_ids = self.tokenizer.encode(call_text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        instances = {}
        start = time.perf_counter()
        text, failed, _ = await self._call_tool(
            OpenAIFunctionParsedSchema(name="calculator", arguments='{"expression": "%s"}' % expression),
            dict(kwargs.get("tools_kwargs") or {}), instances)
        await self._release(instances)
        tool_s = time.perf_counter() - start
        tool_ids = self.tool_turn_ids([{"role": "tool", "content": text}], True)
        response_ids = call_ids + tool_ids
        budget = self.response_length - len(response_ids)
        start = time.perf_counter()
        out = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt_ids + response_ids,
                                                 sampling_params=dict(sampling_params, max_tokens=budget))
        ids = out.token_ids[:budget]
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=response_ids + ids,
            response_mask=[0] * len(response_ids) + [1] * len(ids),
            response_logprobs=[0.0] * len(response_ids) + list(out.log_probs[: len(ids)]), num_turns=4,
            metrics=AgentLoopMetrics(generate_sequences=time.perf_counter() - start, tool_calls=tool_s),
            extra_fields={"tool_calls": 1, "tool_errors": int(failed), "tool_rewards": 0.0})
