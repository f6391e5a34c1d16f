r"""DAPO-Math answer checking (``data_source="math_dapo"`` and AIME sets): the response ends with
``Answer: <answer>``; the answer is normalised as in the Minerva paper (Lewkowycz et al., 2022, appendix D.1)
and compared with the reference as strings. Rewards are +1 / -1 (DAPO trains with a -1 penalty for wrong
answers); the result dict also carries ``acc`` (bool) and ``pred`` (the normalised answer).
With ``strict_box_verify=True`` the last ``\boxed{}`` is used instead of ``Answer:``.
"""

from __future__ import annotations

import re

from verl.utils.reward_score.math import last_boxed_only_string, remove_boxed

_SOLUTION_CLIP_CHARS = 300
_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Minerva's normalisation: textual substitutions, then words/units that carry no value.
_SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                  (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
_REMOVED_EXPRESSIONS = [
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}",
    "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
]


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's normal form of a final answer string."""
    final_answer = final_answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in _REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")
    # keep the argument of \text{...}, \textbf{...}, \overline{...}, \boxed{...}
    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", r"\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", r"\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", r"\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", final_answer)
    # shorthand TeX: \fracab -> \frac{a}{b}, \sqrta -> \sqrt{a}
    final_answer = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", final_answer)
    final_answer = final_answer.replace("$", "")
    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


def extract_answer(solution_str: str, strict_box_verify: bool = False) -> str | None:
    tail = solution_str[-_SOLUTION_CLIP_CHARS:]
    if strict_box_verify:
        boxed = last_boxed_only_string(tail)
        return None if boxed is None else normalize_final_answer(remove_boxed(boxed))
    found = _ANSWER_RE.findall(tail)
    return normalize_final_answer(found[-1]) if found else None


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False) -> dict:
    """``{"score": 1.0 | -1.0, "acc": bool, "pred": str}``."""
    pred = extract_answer(solution_str, strict_box_verify=strict_box_verify)
    truth = normalize_final_answer(str(ground_truth))
    correct = pred is not None and pred == truth
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred if pred is not None else ""}
