"""The embedded arithmetic preference generator: several wrong answers per expression, held-out expressions."""

import pandas as pd
import pytest

from verl.utils.embedded.arithmetic import ArithmeticConfig, evaluate
from verl.utils.embedded.preferences import main, make_kto_rows, make_preference_rows, write_preference_files

ONE_DIGIT = ArithmeticConfig(max_digits=1)


def _expr(row):
    return row["extra_info"]["expression"]


def test_several_wrong_answers_per_expression_are_distinct_and_near():
    rows = make_preference_rows(20, seed=3, config=ONE_DIGIT, rejected_per_prompt=5)
    assert len(rows) == 100
    by_expr: dict[str, list[dict]] = {}
    for row in rows:
        by_expr.setdefault(_expr(row), []).append(row)
    assert len(by_expr) == 20 and all(len(v) == 5 for v in by_expr.values())
    for expression, group in by_expr.items():
        answer = int(evaluate(expression))
        assert {r["chosen"] for r in group} == {str(answer)}
        wrong = [int(r["rejected"]) for r in group]
        assert len(set(wrong)) == 5 and all(1 <= abs(w - answer) <= 9 for w in wrong)
    assert [r["extra_info"]["index"] for r in rows] == list(range(100))
    assert rows == make_preference_rows(20, seed=3, config=ONE_DIGIT, rejected_per_prompt=5)


def test_rejected_per_prompt_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match="rejected_per_prompt=19: choose 1..18"):
        make_preference_rows(2, config=ONE_DIGIT, rejected_per_prompt=19)
    with pytest.raises(ValueError, match="rejected_per_prompt=0"):
        make_preference_rows(2, config=ONE_DIGIT, rejected_per_prompt=0)


def test_files_keep_test_expressions_out_of_training_and_one_sft_row_per_expression(tmp_path):
    paths = write_preference_files(str(tmp_path / "d"), n_train=120, n_test=40, config=ONE_DIGIT,
                                   rejected_per_prompt=3)
    train, test = pd.read_parquet(paths["train"]), pd.read_parquet(paths["test"])
    sft, kto = pd.read_parquet(paths["sft_train"]), pd.read_parquet(paths["kto_train"])
    train_exprs = {e["expression"] for e in train["extra_info"]}
    test_exprs = {e["expression"] for e in test["extra_info"]}
    assert len(train) == 360 and len(train_exprs) == 120 and len(test) == 40 and len(test_exprs) == 40
    assert not train_exprs & test_exprs
    assert len(sft) == 120 and {p[:-1] for p in sft["prompt"]} == train_exprs
    assert all(int(r) == int(evaluate(p[:-1])) for p, r in zip(sft["prompt"], sft["response"]))
    # KTO: each expression's right answer once (desirable), each wrong answer once (undesirable)
    assert int(kto["label"].sum()) == 120 and int((~kto["label"]).sum()) == 360


def test_kto_rows_do_not_repeat_a_shared_chosen_answer():
    pairs = make_preference_rows(2, config=ONE_DIGIT, rejected_per_prompt=2)
    labels = [r["label"] for r in make_kto_rows(pairs)]
    assert labels == [True, False, False, True, False, False]


def test_command_line_writes_the_pairs(tmp_path):
    paths = main(["--out", str(tmp_path / "cli"), "--train", "30", "--test", "10", "--max_digits", "1",
                  "--rejected_per_prompt", "2"])
    assert len(pd.read_parquet(paths["train"])) == 60 and len(pd.read_parquet(paths["test"])) == 10
