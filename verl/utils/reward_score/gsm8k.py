"""GSM8K answer checking.

GSM8K reference solutions end with ``#### <number>``; a policy trained on the verl prompt
("Let's think step by step and output the final answer after \"####\".") is scored by the number
after the last ``####`` (``method="strict"``) or, more leniently, by the last number anywhere in the
response (``method="flexible"``).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# Only the tail of a long response is searched: the final answer is at the end, and a bounded
# search keeps scoring cheap on responses that ramble.
_SOLUTION_CLIP_CHARS = 300

_STRICT_RE = re.compile(r"####\s*(\-?[0-9\.\,\$]+)")
_NUMBER_RE = re.compile(r"(\-?[0-9\.\,]+)")


def normalize_number(text: str | None) -> str | None:
    """``"$1,234."`` -> ``"1234"``; returns None when nothing numeric is left."""
    if text is None:
        return None
    text = str(text).strip().replace(",", "").replace("$", "").rstrip(".")
    if text in ("", "-", "."):
        return None
    return text


def numbers_equal(a: str | None, b: str | None) -> bool:
    """Equal as decimals when both parse (``"72.0" == "72"``), else as normalised strings."""
    a, b = normalize_number(a), normalize_number(b)
    if a is None or b is None:
        return False
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return a == b


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string a response commits to, or None.

    strict:   the number after the last ``####``.
    flexible: the last number in the response (``"."`` and ``""`` are skipped).
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k extract_solution: method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_SOLUTION_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT_RE.findall(tail)
        return normalize_number(found[-1]) if found else None
    for candidate in reversed(_NUMBER_RE.findall(tail)):
        candidate = normalize_number(candidate)
        if candidate is not None:
            return candidate
    return None


def compute_score(solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    """``score`` when the extracted answer equals ``ground_truth``, ``format_score`` when an answer was
    extracted but is wrong, 0 when no answer could be extracted."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if numbers_equal(answer, ground_truth) else float(format_score)


def compute_score_strict_and_flexible(data_source, solution_str: str, ground_truth: str, extra_info=None,
                                      **kwargs) -> dict:
    """A ``custom_reward_function`` (verl's signature) that rewards the strict answer and also reports the
    flexible one, so training and validation curves show both::

        custom_reward_function.path=verl/utils/reward_score/gsm8k.py
        custom_reward_function.name=compute_score_strict_and_flexible

    Returns ``{"score": strict, "acc": strict, "acc_flexible": flexible}``; validation then shows
    ``val-core/<source>/acc/mean@1`` (strict) and ``val-aux/<source>/acc_flexible/mean@1``.
    """
    strict = compute_score(solution_str, ground_truth, method="strict")
    flexible = compute_score(solution_str, ground_truth, method="flexible")
    return {"score": strict, "acc": strict, "acc_flexible": flexible}
