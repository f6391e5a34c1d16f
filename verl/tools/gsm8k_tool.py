"""``Gsm8kTool``: the model submits an answer to a GSM8K problem and hears whether it is right.

``calc_gsm8k_reward(answer)`` (see :class:`~verl.tools.answer_reward_tool.AnswerRewardTool`): the answer is prefixed
with ``#### `` when it lacks the GSM8K marker and scored with the flexible GSM8K scorer (1.0 right, 0.0 otherwise).
Tool config entry::

    - class_name: verl.tools.gsm8k_tool.Gsm8kTool
      config: {type: native}
"""

from __future__ import annotations

from verl.utils.reward_score import gsm8k

from .answer_reward_tool import RESUBMIT_PENALTY, AnswerRewardTool, answer_schema

__all__ = ["Gsm8kTool", "RESUBMIT_PENALTY", "DEFAULT_SCHEMA"]

DEFAULT_SCHEMA = answer_schema("calc_gsm8k_reward", "A tool for calculating the reward of gsm8k")


class Gsm8kTool(AnswerRewardTool):
    """Scores GSM8K answers (see the module docstring)."""

    DEFAULT_SCHEMA = DEFAULT_SCHEMA

    def stored(self, answer: str) -> str:
        return answer if answer.startswith("#### ") else "#### " + answer

    def score(self, response: str, ground_truth: str) -> float:
        return gsm8k.compute_score(response, ground_truth, method="flexible", format_score=0.0, score=1.0)
