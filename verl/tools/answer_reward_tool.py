"""``AnswerRewardTool``: the shape of verl's answer-checking tools (``calc_gsm8k_reward``, ``calc_geo3k_reward``).

Each call ``<name>(answer)`` stores the answer, scores it against the episode's ground truth (:meth:`score`) and
replies with the parsed answer and that score. The call's own reward is 0 when the score improved on the previous
answer and -0.05 otherwise, which discourages resubmitting. ``calc_reward`` gives the latest answer's score. The
ground truth comes from ``create(ground_truth=...)`` or the row's ``tools_kwargs: {<name>: {create_kwargs:
{ground_truth: ...}}}``. A subclass sets ``DEFAULT_SCHEMA`` and :meth:`score` (and :meth:`stored` to normalise
the answer first).
"""

from __future__ import annotations

from typing import Any, Optional

from .base_tool import BaseTool
from .schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["AnswerRewardTool", "RESUBMIT_PENALTY", "answer_schema"]

RESUBMIT_PENALTY = -0.05


def answer_schema(name: str, description: str) -> dict:
    return {"type": "function",
            "function": {"name": name, "description": description,
                         "parameters": {"type": "object",
                                        "properties": {"answer": {"type": "string",
                                                                  "description": "The answer to the question"}},
                                        "required": ["answer"]}}}


class AnswerRewardTool(BaseTool):
    DEFAULT_SCHEMA: dict = {}

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(self.DEFAULT_SCHEMA)
        super().__init__(config, tool_schema)

    def stored(self, answer: str) -> str:
        """The answer as the scorer reads it."""
        return answer

    def score(self, response: str, ground_truth: str) -> float:
        raise NotImplementedError

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
        state["response"] = self.stored(answer)
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else RESUBMIT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return float(self.score(state["response"], str(state["ground_truth"])))
