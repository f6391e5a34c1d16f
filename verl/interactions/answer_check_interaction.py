"""A simulated user that checks the model's answer: the last number in its latest message against the row's
``interaction_kwargs.ground_truth``. Correct: the episode ends with score 1. Wrong: the user says so (the model gets
another try) with score 0, until ``max_attempts`` (config, default 2) answers were given."""

from __future__ import annotations

import re
from typing import Any, Optional

from .base import BaseInteraction

__all__ = ["AnswerCheckInteraction"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class AnswerCheckInteraction(BaseInteraction):
    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.max_attempts = int(self.config.get("max_attempts", 2))

    async def start_interaction(self, instance_id: Optional[str] = None, ground_truth=None, **kwargs) -> str:
        instance_id = await super().start_interaction(instance_id, **kwargs)
        self._instance_dict[instance_id].update(ground_truth=ground_truth, attempts=0, score=0.0)
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        state = self._instance_dict[instance_id]
        state["attempts"] += 1
        answer = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        numbers = _NUMBER.findall(answer)
        correct = bool(numbers) and state["ground_truth"] is not None and \
            float(numbers[-1]) == float(state["ground_truth"])
        state["score"] = 1.0 if correct else 0.0
        if correct:
            return True, "Correct.", 1.0, {}
        if state["attempts"] >= self.max_attempts:
            return True, "Wrong.", 0.0, {}
        return False, "That is not right. Try again.", 0.0, {}

    async def calculate_score(self, instance_id, **kwargs) -> float:
        return float(self._instance_dict.get(instance_id, {}).get("score", 0.0))
