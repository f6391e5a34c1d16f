"""Rule-based score for the embedded arithmetic task (``data_source="arithmetic"``).

Rules, applied to the decoded response:
1. Everything from the first end marker (``<|im_end|>`` or ``<|endoftext|>``) on is ignored.
2. The answer is the first integer in what remains: an optional ``-`` directly before a run of digits
   (``"-3"``, ``" 19 apples"``, ``"=19"``); digits glued to letters count too (``"x19"`` gives 19).
3. No integer at all scores ``0.0``; an integer equal to ``ground_truth`` scores ``score``; any other integer
   scores ``format_score`` (the response had the right shape but the wrong value).
"""

from __future__ import annotations

import re

_END_MARKERS = ("<|im_end|>", "<|endoftext|>")
_INTEGER = re.compile(r"-?\d+")


def extract_answer(solution_str: str) -> int | None:
    """The first integer before any end marker, or None."""
    for marker in _END_MARKERS:
        cut = solution_str.find(marker)
        if cut != -1:
            solution_str = solution_str[:cut]
    match = _INTEGER.search(solution_str)
    return int(match.group()) if match else None


def compute_score(solution_str: str, ground_truth, format_score: float = 0.0, score: float = 1.0) -> float:
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    try:
        truth = int(str(ground_truth).strip())
    except ValueError as err:
        raise ValueError(f"arithmetic ground_truth must be an integer string, got {ground_truth!r}") from err
    return float(score) if answer == truth else float(format_score)
