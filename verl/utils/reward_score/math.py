r"""MATH (Hendrycks et al., 2021) answer checking by string normalisation.

The response's answer is the content of its last ``\boxed{...}`` (or ``\fbox{...}``); it is compared with
the reference after the normalisation the MATH paper's evaluation uses: ``\dfrac``/``\tfrac`` -> ``\frac``,
``\frac12`` -> ``\frac{1}{2}``, ``a/b`` -> ``\frac{a}{b}`` for integers, ``0.5`` -> ``\frac{1}{2}``,
``\sqrt2`` -> ``\sqrt{2}``, no ``\left``/``\right``, degrees, dollars, percent signs, trailing ``\text{ units}``,
spaces, or a short ``x =`` prefix. This is fast and exact; :mod:`verl.utils.reward_score.math_verify` adds
symbolic equivalence on top.
"""

from __future__ import annotations

import re


def last_boxed_only_string(string: str) -> str | None:
    r"""The last ``\boxed{...}`` / ``\fbox{...}`` (braces matched) or ``\boxed x`` span, or None."""
    idx = max(string.rfind("\\boxed"), string.rfind("\\fbox"))
    if idx < 0:
        return None
    head = "\\boxed" if string.startswith("\\boxed", idx) else "\\fbox"
    after = idx + len(head)
    if string.startswith(" ", after):  # "\boxed 5$" form: runs to the next "$" or the end
        end = string.find("$", after)
        return string[idx:] if end < 0 else string[idx:end]
    depth = 0
    for pos in range(after, len(string)):
        ch = string[pos]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return string[idx:pos + 1]
        elif depth == 0 and not ch.isspace():
            return None  # "\boxed" not followed by a group
    return None  # unbalanced braces


def remove_boxed(s: str) -> str:
    r"""``\boxed{X}`` -> ``X`` and ``\boxed X`` -> ``X`` (same for ``\fbox``)."""
    for head in ("\\boxed", "\\fbox"):
        if s.startswith(head + " "):
            return s[len(head) + 1:]
        if s.startswith(head + "{") and s.endswith("}"):
            return s[len(head) + 1:-1]
    raise ValueError(f"remove_boxed: expected a string like '\\boxed{{...}}', got {s!r}")


def _fix_fracs(string: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{7}`` -> ``\frac{1}{7}``, ``\frac{1}2`` -> ``\frac{1}{2}``."""
    parts = string.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if not part:
            continue
        if part[0] == "{":
            # numerator already grouped; group a bare one-character denominator
            depth, end = 0, None
            for i, ch in enumerate(part):
                depth += ch == "{"
                depth -= ch == "}"
                if depth == 0:
                    end = i
                    break
            if end is not None and end + 1 < len(part) and part[end + 1] not in "{\\":
                part = part[:end + 1] + "{" + part[end + 1] + "}" + part[end + 2:]
            out += part
            continue
        if len(part) < 2:
            return string  # malformed, leave untouched
        num, rest = part[0], part[1:]
        if rest[0] == "{":
            out += "{" + num + "}" + rest
        else:
            out += "{" + num + "}{" + rest[0] + "}" + rest[1:]
    return out


def _fix_a_slash_b(string: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(\d+)", string)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else string


def _remove_right_units(string: str) -> str:
    # "5 \text{ cm}" -> "5 "; only the units form with a space after "\text{"
    if "\\text{ " in string:
        return string.split("\\text{ ")[0]
    return string


def _fix_sqrt(string: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}`` (one character argument)."""
    return re.sub(r"\\sqrt(?!\{)(\w)", r"\\sqrt{\1}", string)


def strip_string(string: str) -> str:
    """The MATH normal form of an answer string."""
    s = str(string).replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = _remove_right_units(s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and len(lhs.strip()) <= 2:
        s = rhs  # "x = 5" -> "5", "k=3" -> "3"
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    s = _fix_a_slash_b(s)
    s = s.rstrip(".")
    return s


def is_equiv(str1: str | None, str2: str | None, verbose: bool = False) -> bool:
    """True when the two answers have the same MATH normal form."""
    if str1 is None and str2 is None:
        return True
    if str1 is None or str2 is None:
        return False
    try:
        ss1, ss2 = strip_string(str1), strip_string(str2)
    except Exception:  # a normalisation bug must not turn into a crash in the reward loop
        return str1 == str2
    if verbose:
        print(f"is_equiv: {ss1!r} vs {ss2!r}")
    return ss1 == ss2


def extract_answer(solution_str: str) -> str | None:
    r"""The content of the last ``\boxed{}`` in a response, or None."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return None
    try:
        return remove_boxed(boxed)
    except ValueError:
        return None


def compute_score(solution_str: str, ground_truth: str) -> float:
    r"""1.0 when the last ``\boxed{}`` answer is equivalent to ``ground_truth`` (itself possibly boxed), else 0.0."""
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    truth = ground_truth
    if "\\boxed" in str(ground_truth) or "\\fbox" in str(ground_truth):
        truth = extract_answer(str(ground_truth)) or ground_truth
    return 1.0 if is_equiv(answer, truth) else 0.0
