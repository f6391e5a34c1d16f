"""``Gsm8kInteraction`` (verl's name): a simulated user that grades the model's latest answer to a GSM8K problem.

The last assistant message is scored with the strict GSM8K scorer (the answer after ``#### `` against the row's
``interaction_kwargs.ground_truth``: 1.0 right, 0.0 otherwise). Right: the episode ends with score 1. Wrong: the
user says so and asks for another try (score 0); the episode goes on until the turn limits
(``multi_turn.max_user_turns`` / ``max_assistant_turns``) end it. Interaction config entry::

    interaction:
      - name: gsm8k
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}
"""

from __future__ import annotations

from typing import Any, Optional

from verl.utils.reward_score import gsm8k

from .base import BaseInteraction

__all__ = ["Gsm8kInteraction"]

RIGHT = "Your answer is correct."
WRONG = "Your answer is not correct. Check your reasoning and answer again, ending with #### <number>."


class Gsm8kInteraction(BaseInteraction):
    async def start_interaction(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None,
                                **kwargs) -> str:
        instance_id = await super().start_interaction(instance_id, **kwargs)
        self._instance_dict[instance_id].update(ground_truth=ground_truth, response="", reward=0.0)
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs
                                ) -> tuple[bool, str, float, dict[str, Any]]:
        state = self._instance_dict[instance_id]
        state["response"] = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"),
                                 "")
        reward = await self.calculate_score(instance_id)
        state["reward"] = reward
        return (True, RIGHT, reward, {}) if reward == 1.0 else (False, WRONG, reward, {})

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        state = self._instance_dict[instance_id]
        if state.get("ground_truth") is None:
            return 0.0
        return float(gsm8k.compute_score(str(state["response"]), str(state["ground_truth"]), method="strict",
                                         format_score=0.0, score=1.0))
