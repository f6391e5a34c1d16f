r"""Geometry3K answers (verl's ``hiyouga/geometry3k`` data source and its ``calc_geo3k_reward`` tool).

``compute_score(predict_str, ground_truth, use_boxed=True, format_score=0.1)`` is
``(1 - format_score) * accuracy + format_score * format``: accuracy 1.0 when the answer (the last ``\boxed{}``
content, or the whole string with ``use_boxed=False``) has the same MATH normal form as the ground truth (``2\sqrt{3}``
and ``2\sqrt3``, ``\frac12`` and ``1/2``, a trailing ``.``; see :func:`verl.utils.reward_score.math.is_equiv`),
and format 1.0 when the response reasons in ``<think>...</think>`` and then boxes its answer.
"""

from __future__ import annotations

import re

from verl.utils.reward_score import math as math_score

__all__ = ["format_reward", "acc_reward", "compute_score"]

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(predict_str: str) -> float:
    return 1.0 if _FORMAT.fullmatch(predict_str) else 0.0


def acc_reward(predict_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    answer = math_score.extract_answer(predict_str) if use_boxed else predict_str
    if answer is None:
        return 0.0
    return 1.0 if math_score.is_equiv(answer.strip(), str(ground_truth).strip()) else 0.0


def compute_score(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    return (1.0 - format_score) * acc_reward(predict_str, ground_truth, use_boxed) + \
        format_score * format_reward(predict_str)
