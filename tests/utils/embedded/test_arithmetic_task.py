"""The arithmetic task generator and its rule-based scorer."""

import pytest

from verl.utils.embedded.arithmetic import (
    ArithmeticConfig,
    evaluate,
    generate_problems,
    make_rl_rows,
    make_sft_rows,
)
from verl.utils.reward_score.arithmetic import compute_score, extract_answer


def test_generator_is_seeded_and_answers_are_right():
    cfg = ArithmeticConfig(min_digits=1, max_digits=3, operators="+-*/", min_terms=2, max_terms=4, paren_prob=0.5)
    a = generate_problems(300, seed=7, config=cfg)
    assert a == generate_problems(300, seed=7, config=cfg)
    assert a != generate_problems(300, seed=8, config=cfg)
    ops_seen, parens = set(), 0
    for expr, ans in a:
        assert eval(expr) == ans  # exact: division only where it divides
        numbers = expr.replace("(", " ").replace(")", " ")
        for op in "+-*/":
            numbers = numbers.replace(op, " ")
        terms = numbers.split()
        assert 2 <= len(terms) <= 4 and all(1 <= len(t) <= 3 for t in terms)
        ops_seen |= set(expr) & set("+-*/")
        parens += "(" in expr
    assert ops_seen == set("+-*/") and parens > 20


def test_knobs_restrict_output():
    cfg = ArithmeticConfig(min_digits=2, max_digits=2, operators="-", allow_negative=False)
    for expr, ans in generate_problems(200, seed=0, config=cfg):
        a, b = expr.split("-")
        assert len(a) == len(b) == 2 and ans >= 0 and ans == int(a) - int(b)
    with pytest.raises(ValueError, match="operators"):
        generate_problems(1, config=ArithmeticConfig(operators="+%"))
    with pytest.raises(ValueError, match="min_terms"):
        generate_problems(1, config=ArithmeticConfig(min_terms=3, max_terms=2))
    with pytest.raises(ValueError, match="unsupported"):
        evaluate("__import__('os')")


def test_rows_follow_verl_schema():
    rows = make_rl_rows(5, split="test", seed=1)
    for i, row in enumerate(rows):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == "arithmetic" and row["ability"] == "math"
        (msg,) = row["prompt"]
        assert msg["role"] == "user" and msg["content"].endswith("=")
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(eval(msg["content"][:-1]))}
        assert row["extra_info"] == {"split": "test", "index": i, "expression": msg["content"][:-1]}
    sft = make_sft_rows(5, split="test", seed=1)
    assert [r["prompt"] for r in sft] == [r["prompt"][0]["content"] for r in rows]
    assert [r["response"] for r in sft] == [r["reward_model"]["ground_truth"] for r in rows]


@pytest.mark.parametrize(
    "response, expected",
    [
        ("19", 1.0),
        ("19<|im_end|>", 1.0),
        (" 19 is the answer", 1.0),
        ("=19", 1.0),
        ("19<|im_end|>20", 1.0),
        ("20<|im_end|>19", 0.5),  # first integer is wrong: format score
        ("<|im_end|>19", 0.0),  # nothing before the end marker
        ("no idea", 0.0),
        ("", 0.0),
        ("190", 0.5),
        ("1 9", 0.5),
    ],
)
def test_compute_score_rules(response, expected):
    assert compute_score(response, "19", format_score=0.5) == expected


def test_compute_score_negative_and_defaults():
    assert compute_score("-3", "-3") == 1.0
    assert compute_score("3", "-3") == 0.0
    assert compute_score("7", 7, score=2.0) == 2.0
    assert extract_answer("x-12y") == -12
    with pytest.raises(ValueError, match="ground_truth"):
        compute_score("3", "three")
