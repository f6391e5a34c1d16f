r"""GSM-Symbolic (reasoning-gym's ``gsm_symbolic`` dataset): grade-school problems with an integer answer.

The response's answer is, in order of preference: the last ``<answer>...</answer>`` (reasoning-gym's
format), the number after the last ``####`` (GSM8K's), the last ``\boxed{}``, or the last number.
"""

from __future__ import annotations

import re

from verl.utils.reward_score import gsm8k
from verl.utils.reward_score.math import extract_answer as _boxed_answer

_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_solution(solution_str: str) -> str | None:
    tagged = _ANSWER_TAG_RE.findall(solution_str)
    if tagged:
        return gsm8k.extract_solution(tagged[-1], method="flexible")
    strict = gsm8k.extract_solution(solution_str, method="strict")
    if strict is not None:
        return strict
    boxed = _boxed_answer(solution_str)
    if boxed is not None:
        return gsm8k.extract_solution(boxed, method="flexible")
    return gsm8k.extract_solution(solution_str, method="flexible")


def compute_score(solution_str: str, ground_truth, format_score: float = 0.0, score: float = 1.0) -> float:
    """``score`` when the extracted answer equals ``ground_truth`` numerically, ``format_score`` when an
    answer was found but is wrong, 0 when none was found."""
    answer = extract_solution(solution_str)
    if answer is None:
        return 0.0
    truth = gsm8k.extract_solution(str(ground_truth), method="strict") or str(ground_truth)
    return float(score) if gsm8k.numbers_equal(answer, truth) else float(format_score)
