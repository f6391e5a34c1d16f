"""``Gsm8kTool``: the model submits an answer to a GSM8K problem and hears whether it is right.

Each call ``calc_gsm8k_reward(answer)`` stores the answer (prefixed with ``#### `` when it lacks the GSM8K marker),
scores it against the episode's ground truth with the flexible GSM8K scorer (1.0 right, 0.0 otherwise) and replies
with the parsed answer and that score. The call's own reward is 0 when the score improved on the previous answer and
-0.05 otherwise, which discourages resubmitting. ``calc_reward`` gives the latest answer's score. The ground truth
comes from ``create(ground_truth=...)`` or the row's ``tools_kwargs: {calc_gsm8k_reward: {create_kwargs:
{ground_truth: ...}}}``. Tool config entry::

    - class_name: verl.tools.gsm8k_tool.Gsm8kTool
      config: {type: native}
"""

from __future__ import annotations

from typing import Any, Optional

from verl.utils.reward_score import gsm8k

from .base_tool import BaseTool
from .schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["Gsm8kTool"]

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc_gsm8k_reward",
        "description": "A tool for calculating the reward of gsm8k",
        "parameters": {"type": "object",
                       "properties": {"answer": {"type": "string", "description": "The answer to the question"}},
                       "required": ["answer"]},
    },
}
RESUBMIT_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    """Scores GSM8K answers (see the module docstring)."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA)
        super().__init__(config, tool_schema)

    async def create(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id, **kwargs)
        if ground_truth is None:
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float,
                                                                                             dict]:
        answer = str(parameters.get("answer", ""))
        state = self._instances[instance_id]
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else RESUBMIT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return gsm8k.compute_score(state["response"], str(state["ground_truth"]), method="flexible",
                                   format_score=0.0, score=1.0)
