"""Countdown: combine the given numbers with + - * / to reach a target (TinyZero's task).

``ground_truth = {"target": int, "numbers": [int, ...]}``. The response's last ``<answer>...</answer>`` must
hold an arithmetic expression that uses every given number exactly once and evaluates to the target.
The expression is evaluated by walking its syntax tree with only numbers, parentheses, unary minus and the
four operators allowed; nothing is ever passed to ``eval``.
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED_CHARS = re.compile(r"^[\d+\-*/().\s]+$")
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_MAX_EXPR_CHARS = 200


def extract_solution(solution_str: str) -> str | None:
    """The equation inside the last ``<answer>`` tag (text after ``Assistant:`` if present), or None."""
    for marker in ("Assistant:", "<|im_start|>assistant"):
        if marker in solution_str:
            solution_str = solution_str.split(marker, 1)[1]
            break
    found = _ANSWER_RE.findall(solution_str)
    return found[-1].strip() if found else None


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_node(node.left), _eval_node(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval_node(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(f"disallowed syntax in countdown equation: {type(node).__name__}")


def safe_eval(equation: str) -> float | None:
    """Value of an expression of numbers, parentheses and + - * /, or None if it is anything else
    (names, calls, ``**``, too long) or cannot be evaluated (division by zero)."""
    if len(equation) > _MAX_EXPR_CHARS or not _ALLOWED_CHARS.match(equation):
        return None
    try:
        return float(_eval_node(ast.parse(equation, mode="eval")))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None


def validate_equation(equation: str, available_numbers) -> bool:
    """True when the numbers written in ``equation`` are exactly ``available_numbers`` (each once)."""
    used = [int(n) for n in re.findall(r"\d+", equation)]
    return Counter(used) == Counter(int(n) for n in available_numbers)


def compute_score(solution_str: str, ground_truth, method: str = "strict", format_score: float = 0.1,
                  score: float = 1.0) -> float:
    """``score`` for a correct equation, ``format_score`` for a well-formed ``<answer>`` that is wrong
    (wrong numbers, wrong value, unparsable), 0 when there is no ``<answer>``."""
    target = ground_truth["target"]
    numbers = list(ground_truth["numbers"])
    equation = extract_solution(solution_str)
    if equation is None:
        return 0.0
    if not validate_equation(equation, numbers):
        return float(format_score)
    value = safe_eval(equation)
    if value is None:
        return float(format_score)
    return float(score) if abs(value - float(target)) < 1e-5 else float(format_score)
