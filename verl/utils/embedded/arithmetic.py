"""Integer arithmetic problems in verl's parquet schema (the embedded task).

A problem is a short expression followed by "=", e.g. ``"12+7="``, whose answer is an integer (``"19"``).
Difficulty knobs: operand digits, the operator set, the number of terms, optional parentheses and whether
negative answers are allowed. Division appears only where it is exact. The same seed gives the same rows.

    from verl.utils.embedded.arithmetic import ArithmeticConfig, make_rl_rows, make_sft_rows
    rows = make_rl_rows(100, split="train", seed=0, config=ArithmeticConfig(max_digits=2, operators="+-"))

RL row: ``{"data_source": "arithmetic", "prompt": [{"role": "user", "content": "12+7="}], "ability": "math",
"reward_model": {"style": "rule", "ground_truth": "19"}, "extra_info": {"split", "index", "expression"}}``.
SFT row: ``{"prompt": "12+7=", "response": "19", "data_source", "extra_info"}`` (verl's SFTDataset applies the
chat template to the prompt and appends eos to the response).
"""

from __future__ import annotations

import ast
import random
from dataclasses import asdict, dataclass
from fractions import Fraction

DATA_SOURCE = "arithmetic"
ABILITY = "math"
ALLOWED_OPERATORS = "+-*/"


@dataclass(frozen=True)
class ArithmeticConfig:
    """Difficulty knobs. Operands have ``min_digits..max_digits`` digits; expressions have
    ``min_terms..max_terms`` operands joined by operators drawn from ``operators``; with probability
    ``paren_prob`` one inner run of terms is wrapped in parentheses (only for 3+ terms)."""

    min_digits: int = 1
    max_digits: int = 2
    operators: str = "+-"
    min_terms: int = 2
    max_terms: int = 2
    allow_negative: bool = True
    paren_prob: float = 0.0

    def validate(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {self.min_digits}, {self.max_digits}")
        if not self.operators or any(op not in ALLOWED_OPERATORS for op in self.operators):
            raise ValueError(f"operators must be a non-empty subset of {ALLOWED_OPERATORS!r}, got {self.operators!r}")
        if not 2 <= self.min_terms <= self.max_terms:
            raise ValueError(f"need 2 <= min_terms <= max_terms, got {self.min_terms}, {self.max_terms}")
        if not 0.0 <= self.paren_prob <= 1.0:
            raise ValueError(f"paren_prob must be in [0, 1], got {self.paren_prob}")


def evaluate(expression: str) -> Fraction:
    """Exact value of an expression made of integers, + - * / and parentheses (no names, no calls)."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.Div):
                return a / b
        raise ValueError(f"unsupported element in arithmetic expression {expression!r}")

    return walk(ast.parse(expression, mode="eval"))


def _operand(rng: random.Random, cfg: ArithmeticConfig) -> int:
    digits = rng.randint(cfg.min_digits, cfg.max_digits)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def generate_problem(rng: random.Random, cfg: ArithmeticConfig) -> tuple[str, int]:
    """One ``(expression, answer)`` pair; expressions whose value is not an integer (or is negative when
    ``allow_negative`` is off) are redrawn."""
    for _ in range(1000):
        n = rng.randint(cfg.min_terms, cfg.max_terms)
        terms = [str(_operand(rng, cfg)) for _ in range(n)]
        ops = [rng.choice(cfg.operators) for _ in range(n - 1)]
        if n >= 3 and rng.random() < cfg.paren_prob:
            i = rng.randint(0, n - 2)
            j = rng.randint(i + 1, min(n - 1, i + n - 2))  # never wrap the whole expression
            terms[i], terms[j] = "(" + terms[i], terms[j] + ")"
        expression = terms[0] + "".join(op + t for op, t in zip(ops, terms[1:], strict=True))
        try:
            value = evaluate(expression)
        except ZeroDivisionError:
            continue
        if value.denominator != 1 or (value < 0 and not cfg.allow_negative):
            continue
        return expression, int(value)
    raise RuntimeError(f"could not draw an integer-valued problem with {cfg}; widen the knobs (e.g. fewer '/')")


def generate_problems(n: int, seed: int = 0, config: ArithmeticConfig | None = None) -> list[tuple[str, int]]:
    """``n`` problems from one seeded stream (no global RNG is touched)."""
    cfg = config or ArithmeticConfig()
    cfg.validate()
    rng = random.Random(seed)
    return [generate_problem(rng, cfg) for _ in range(n)]


def make_rl_rows(n: int, split: str = "train", seed: int = 0, config: ArithmeticConfig | None = None) -> list[dict]:
    """Rows in verl's RL parquet schema (see the module docstring)."""
    rows = []
    for index, (expression, answer) in enumerate(generate_problems(n, seed, config)):
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": expression + "="}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"split": split, "index": index, "expression": expression},
            }
        )
    return rows


def make_sft_rows(n: int, split: str = "train", seed: int = 0, config: ArithmeticConfig | None = None) -> list[dict]:
    """Rows for verl's single-turn SFT: ``prompt`` (plain string), ``response`` (the answer)."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": expression + "=",
            "response": str(answer),
            "extra_info": {"split": split, "index": index, "expression": expression},
        }
        for index, (expression, answer) in enumerate(generate_problems(n, seed, config))
    ]


def config_as_dict(config: ArithmeticConfig) -> dict:
    return asdict(config)
