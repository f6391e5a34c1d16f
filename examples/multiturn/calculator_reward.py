"""Score a ``tool_agent`` episode on the calculator task by its final answer, and count its tool use.

    custom_reward_function.path=examples/multiturn/calculator_reward.py   (name: compute_score)

Why a scorer of its own: the built-in ``arithmetic`` score takes the first integer of the whole response, and in
a tool episode that is a digit of the tool call (``<tool_call>{... "123*45"}...``), not the answer. This one reads
the episode the way the agent loop wrote it. The reward manager decodes the response without special tokens, so
every tool turn appears as ``\\ntool\\n<result>\\nassistant\\n`` (the chat template's role lines) between the model's
turns. The final answer is the model's last turn with any ``<tool_call>`` text removed; the score is 1.0 when its
first integer equals the ground truth (the built-in rule), else 0.0.

Besides ``score`` (also returned as ``acc``) the result has per-episode counts, which the trainer averages into
the validation metrics ``val-aux/<data_source>/<key>/mean@N``:

- ``tool_calls``: ``<tool_call>`` blocks the model opened (well-formed or not);
- ``tool_ok``: tool results that are a value, not an ``Error: ...`` message (well-formed calls that ran);
- ``tool_errors``: tool results that are errors (malformed JSON, unknown tool, a bad expression ...);
- ``tool_right``: tool results equal to the ground truth (the call computed the right thing);
- ``num_turns``: the agent loop's turn count, when the batch has it.

Tool-call success rate over a set of episodes = sum(tool_ok) / sum(tool_calls) = mean(tool_ok) / mean(tool_calls).
"""

from __future__ import annotations

import re

from verl.utils.reward_score.arithmetic import compute_score as arithmetic_score

__all__ = ["compute_score", "split_episode"]

_TOOL_TURN = re.compile(r"\ntool\n(.*?)\nassistant\n", re.DOTALL)
_CALL = "<tool_call>"


def split_episode(response: str) -> tuple[list[str], list[str]]:
    """(model turns, tool results) of a decoded ``tool_agent`` response, in order."""
    model_turns, results, pos = [], [], 0
    for match in _TOOL_TURN.finditer(response):
        model_turns.append(response[pos:match.start()])
        results.append(match.group(1))
        pos = match.end()
    model_turns.append(response[pos:])
    return model_turns, results


def final_answer(model_turns: list[str]) -> str:
    """The last model turn without its tool-call text (a closed block is removed, an unclosed one cut off)."""
    text = re.sub(r"<tool_call>.*?</tool_call>", "", model_turns[-1], flags=re.DOTALL)
    return text.split(_CALL, 1)[0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    model_turns, results = split_episode(solution_str)
    score = arithmetic_score(final_answer(model_turns), ground_truth)
    truth = str(ground_truth).strip()
    errors = sum(r.strip().startswith("Error") for r in results)
    out = {
        "score": score,
        "acc": score,
        "tool_calls": sum(turn.count(_CALL) for turn in model_turns),
        "tool_ok": len(results) - errors,
        "tool_errors": errors,
        "tool_right": sum(r.strip() == truth for r in results),
    }
    turns = (extra_info or {}).get("num_turns")
    if turns is not None:
        out["num_turns"] = float(turns)
    return out
