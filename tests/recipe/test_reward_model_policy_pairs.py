"""recipe.reward_model.policy_pairs: rule-labelled (right, wrong) pairs from the policy's own samples."""

import pandas as pd
import pytest

from recipe.reward_model.policy_pairs import build_pairs, main


def _samples():
    def row(expr, truth, responses):
        return {"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"{expr}="}],
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {"expression": expr}, "responses": responses}
    return pd.DataFrame([
        row("3+4", "7", ["7", "8", "7", "-1", ""]),   # 2 distinct wrong, 1 distinct right, one empty
        row("2-5", "-3", ["3", "4"]),                # none right
        row("1+1", "2", ["2", "2"]),                 # all right
    ])


def test_pairs_are_right_vs_wrong_of_the_same_prompt():
    pairs, counts = build_pairs(_samples(), pairs_per_prompt=16)
    assert sorted(zip(pairs["chosen"], pairs["rejected"])) == [("7", "-1"), ("7", "8")]
    assert all(p[0]["content"] == "3+4=" for p in pairs["prompt"])
    assert "responses" not in pairs.columns and "extra_info" in pairs.columns
    assert counts["samples"] == 9 and counts["correct"] == 4 and counts["empty"] == 1
    assert counts["prompts_without_pairs"] == 2 and counts["pairs"] == 2


def test_reference_answer_and_cap():
    pairs, counts = build_pairs(_samples(), pairs_per_prompt=1, reference_when_none_correct=True, seed=3)
    by_prompt = {p[0]["content"]: (c, r) for p, c, r in zip(pairs["prompt"], pairs["chosen"], pairs["rejected"])}
    assert len(pairs) == 2 and by_prompt["2-5="][0] == "-3" and by_prompt["2-5="][1] in {"3", "4"}
    assert by_prompt["3+4="][0] == "7"
    assert counts["prompts_with_reference_chosen"] == 1


def test_cli_errors_name_the_fix(tmp_path):
    bad = tmp_path / "no_responses.parquet"
    _samples().drop(columns="responses").to_parquet(bad)
    with pytest.raises(ValueError, match="main_generation"):
        main(["--samples", str(bad), "--out", str(tmp_path / "o.parquet")])
    only_right = tmp_path / "right.parquet"
    _samples().iloc[[2]].to_parquet(only_right)
    with pytest.raises(SystemExit, match="reference_when_none_correct"):
        main(["--samples", str(only_right), "--out", str(tmp_path / "o.parquet")])
    good = tmp_path / "s.parquet"
    _samples().to_parquet(good)
    main(["--samples", str(good), "--out", str(tmp_path / "o.parquet")])
    assert len(pd.read_parquet(tmp_path / "o.parquet")) == 2
