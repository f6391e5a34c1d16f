"""main_eval: pass@k arithmetic against hand computations, verl's metric, and clear errors on bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir

from verl.trainer.main_eval import compute_metrics, default_ks, pass_at_k, run_eval
from verl.utils.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")


def eval_cfg(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="evaluation", overrides=list(overrides))


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


def row(responses, truth="5", source="openai/gsm8k"):
    return {"data_source": source, "prompt": [{"role": "user", "content": "q"}], "responses": responses,
            "reward_model": {"style": "rule", "ground_truth": truth}}


def test_pass_at_k_by_hand():
    # n=4, c=1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2; pass@4 = 1
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(3, 0, 2) == 0.0 and pass_at_k(3, 3, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    assert default_ks(4) == [1, 2, 4] and default_ks(6) == [1, 2, 4, 6] and default_ks(1) == [1]


def test_compute_metrics_by_hand():
    scored = [("a", [1.0, 0.0, 0.0, 0.0]), ("a", [1.0, 1.0, 0.0, 0.0]), ("b", [0.0, 0.0]), ("b", [1.0, 0.0])]
    m = compute_metrics(scored)
    # a: mean of row means (0.25 + 0.5) / 2; pass@2 = mean(1 - C(3,2)/C(4,2), 1 - C(2,2)/C(4,2)) = (1/2 + 5/6) / 2
    assert m["test_score/a"] == pytest.approx(0.375)
    assert m["pass@1/a"] == pytest.approx(0.375)
    assert m["pass@2/a"] == pytest.approx((0.5 + 5 / 6) / 2)
    assert m["pass@4/a"] == pytest.approx(1.0)
    assert m["test_score/b"] == pytest.approx(0.25) and m["pass@2/b"] == pytest.approx(0.5)
    assert "pass@4/b" not in m and m["num_prompts/b"] == 2
    # partial credit: the threshold decides what counts as correct
    assert compute_metrics([("c", [0.5, 0.5])], threshold=0.5)["pass@1/c"] == 1.0
    assert compute_metrics([("c", [0.5, 0.5])])["pass@1/c"] == 0.0


def test_run_eval_scores_with_the_gsm8k_rule(tmp_path, capsys):
    path = write(tmp_path / "gen.parquet", [
        row(["so #### 5", "it is 5", "#### 4", "#### 5.0"]),          # strict: 1, 0, 0, 1
        row(["#### 7", "7", "#### 1", "#### 2"], truth="7"),            # strict: 1, 0, 0, 0
    ])
    out = tmp_path / "m" / "metrics.json"
    m = run_eval(eval_cfg(f"data.path={path}", f"output_path={out}"))
    assert m["test_score/openai/gsm8k"] == pytest.approx((0.5 + 0.25) / 2)
    assert m["pass@2/openai/gsm8k"] == pytest.approx(((1 - 1 / 6) + 0.5) / 2)
    assert json.loads(out.read_text()) == m
    assert "test_score/openai/gsm8k: 0.3750" in capsys.readouterr().out
    flexible = run_eval(eval_cfg(f"data.path={path}", "+custom_reward_function.reward_kwargs.method=flexible"))
    assert flexible["test_score/openai/gsm8k"] == pytest.approx((0.75 + 0.5) / 2)


def test_custom_reward_function(tmp_path):
    path = write(tmp_path / "gen.parquet", [row(["aa", "b"], source="mine")])
    fn = tmp_path / "fn.py"
    fn.write_text("def score(data_source, solution_str, ground_truth):\n    return len(solution_str) / 2\n")
    m = run_eval(eval_cfg(f"data.path={path}", f"custom_reward_function.path={fn}",
                          "custom_reward_function.name=score", "pass_at_k.ks=[1]"))
    assert m["test_score/mine"] == pytest.approx(0.75) and m["pass@1/mine"] == pytest.approx(0.5)


def test_bad_inputs(tmp_path):
    missing = write(tmp_path / "a.parquet", [row(["#### 5"]), {**row(["#### 5"]), "reward_model": {"style": "rule"}}])
    with pytest.raises(ConfigError, match="row 1 of .*a.parquet: reward_model.ground_truth is missing"):
        run_eval(eval_cfg(f"data.path={missing}"))
    no_col = write(tmp_path / "b.parquet", [{k: v for k, v in row(["x"]).items() if k != "responses"}])
    with pytest.raises(ConfigError, match="no column 'responses' \\(data.response_key\\)"):
        run_eval(eval_cfg(f"data.path={no_col}"))
    with pytest.raises(ConfigError, match="does not exist"):
        run_eval(eval_cfg(f"data.path={tmp_path / 'nope.parquet'}"))
    ok = write(tmp_path / "c.parquet", [row(["#### 5", "#### 4"])])
    with pytest.raises(ConfigError, match="k=4 is larger"):
        run_eval(eval_cfg(f"data.path={ok}", "pass_at_k.ks=[4]"))
    with pytest.raises(ConfigError, match="ray_init.num_cpus=4 has no effect"):
        run_eval(eval_cfg(f"data.path={ok}", "ray_init.num_cpus=4"))


def test_cli_error_exit_code(tmp_path):
    bad = write(tmp_path / "a.parquet", [{**row(["#### 5"]), "reward_model": {"style": "rule"}}])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_eval", f"data.path={bad}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "ground_truth is missing" in proc.stderr
    typo = subprocess.run([sys.executable, "-m", "verl.trainer.main_eval", "data.respons_key=x"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert typo.returncode == 2 and "response_key" in typo.stderr
