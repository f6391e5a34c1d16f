"""A calculator tool: evaluates an arithmetic expression safely (parsed with ``ast``, never ``eval``).

Allowed: numbers, ``+ - * / // % **``, unary ``+ -``, parentheses and the functions ``abs, round, min, max,
sqrt, floor, ceil``. Exponents above ``max_exponent`` (config, default 64) and results with more than
``max_digits`` digits (default 100) are refused, so a call cannot make the process spend minutes on a huge power.
With ``create_kwargs: {ground_truth: N}`` the tool also rewards a call whose result equals N (``calc_reward``).
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Optional

from .base_tool import BaseTool
from .schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["CalculatorTool", "safe_eval", "CalculatorError"]

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "floor": math.floor,
          "ceil": math.ceil}

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression, e.g. '123 * 456 + 7'.",
        "parameters": {"type": "object",
                       "properties": {"expression": {"type": "string", "description": "the expression"}},
                       "required": ["expression"]},
    },
}


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated."""


def safe_eval(expression: str, max_exponent: int = 64, max_digits: int = 100, max_length: int = 500):
    """Value of an arithmetic expression (see the module docstring for what is allowed)."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > max_length:
        raise CalculatorError(f"expression longer than {max_length} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None

    def check(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CalculatorError(f"unsupported value {value!r}")
        if isinstance(value, int) and abs(value) >= 10 ** max_digits:
            raise CalculatorError(f"result has more than {max_digits} digits")
        return value

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value,
                                                                                                       bool):
            return check(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > max_exponent:
                raise CalculatorError(f"exponent {right} is larger than {max_exponent}")
            try:
                return check(_BINOPS[type(node.op)](left, right))
            except ZeroDivisionError:
                raise CalculatorError("division by zero") from None
            except OverflowError:
                raise CalculatorError("result too large") from None
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return check(_UNARY[type(node.op)](ev(node.operand)))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
                and not node.keywords):
            args = [ev(a) for a in node.args]
            try:
                return check(_FUNCS[node.func.id](*args))
            except (TypeError, ValueError) as exc:
                raise CalculatorError(f"{node.func.id}: {exc}") from None
        raise CalculatorError(f"'{ast.unparse(node)}' is not allowed (numbers, + - * / // % **, parentheses and "
                              f"{', '.join(sorted(_FUNCS))})")

    return ev(tree)


def format_number(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


class CalculatorTool(BaseTool):
    """``calculator(expression)`` -> the value as text (see the module docstring)."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA)
        super().__init__(config, tool_schema)
        self.max_exponent = int(self.config.get("max_exponent", 64))
        self.max_digits = int(self.config.get("max_digits", 100))

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id, **kwargs)
        self._instances[instance_id]["reward"] = 0.0
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        expression = parameters.get("expression")
        if expression is None:
            return ToolResponse(text="Error: missing argument 'expression'"), 0.0, {"error": 1}
        try:
            value = safe_eval(str(expression), self.max_exponent, self.max_digits)
        except CalculatorError as exc:
            return ToolResponse(text=f"Error: {exc}"), 0.0, {"error": 1}
        state = self._instances.get(instance_id, {})
        truth = state.get("ground_truth")
        reward = 0.0
        if truth is not None:
            try:
                reward = 1.0 if float(value) == float(truth) else 0.0
            except (TypeError, ValueError):
                reward = 0.0
            state["reward"] = max(state.get("reward", 0.0), reward)
        return ToolResponse(text=format_number(value)), reward, {"error": 0}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return float(self._instances.get(instance_id, {}).get("reward", 0.0))
