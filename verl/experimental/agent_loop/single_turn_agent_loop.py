"""``single_turn_agent``: one model turn on the prompt (what the batch rollout does, as an agent loop)."""

from __future__ import annotations

import time
from typing import Any
from uuid import uuid4

from verl.utils.rollout_trace import rollout_trace_op

from .agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

__all__ = ["SingleTurnAgentLoop"]


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """Generate one response for the dataset's prompt tokens (``raw_prompt_ids``)."""

    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        prompt_ids = list(kwargs["raw_prompt_ids"])
        start = time.perf_counter()
        out = await self.server_manager.generate(uuid4().hex, prompt_ids=prompt_ids,
                                                 sampling_params=dict(sampling_params,
                                                                      max_tokens=self.response_length))
        ids = out.token_ids[: self.response_length]
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=ids, response_mask=[1] * len(ids),
                               response_logprobs=out.log_probs[: len(ids)], num_turns=2,
                               metrics=AgentLoopMetrics(generate_sequences=time.perf_counter() - start))
