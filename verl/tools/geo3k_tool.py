"""``Geo3kTool``: the model submits an answer to a Geometry3K problem and hears whether it is right.

``calc_geo3k_reward(answer)`` (see :class:`~verl.tools.answer_reward_tool.AnswerRewardTool`): the submitted answer
itself (not a boxed part of it) is compared with the ground truth by MATH normal form
(:func:`verl.utils.reward_score.geo3k.compute_score` with ``use_boxed=False``, no format score): 1.0 right, 0.0
otherwise. Tool config entry::

    - class_name: verl.tools.geo3k_tool.Geo3kTool
      config: {type: native}
"""

from __future__ import annotations

from verl.utils.reward_score import geo3k

from .answer_reward_tool import AnswerRewardTool, answer_schema

__all__ = ["Geo3kTool", "DEFAULT_SCHEMA"]

DEFAULT_SCHEMA = answer_schema("calc_geo3k_reward", "A tool for calculating the reward of geo3k")


class Geo3kTool(AnswerRewardTool):
    """Scores Geometry3K answers (see the module docstring)."""

    DEFAULT_SCHEMA = DEFAULT_SCHEMA

    def score(self, response: str, ground_truth: str) -> float:
        return geo3k.compute_score(response, ground_truth, use_boxed=False, format_score=0.0)
