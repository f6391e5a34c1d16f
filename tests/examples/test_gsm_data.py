"""GSM-style data as verl users prepare it: gsm8k.py with verl's flags, gsm_symbolic.py (deterministic, test
disjoint from train), both scored by the GSM8K rule reward."""

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from verl.utils.reward_score import default_compute_score

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "data_preprocess"


def run(name, *args, env_extra=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), **(env_extra or {}))
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_gsm8k_local_save_dir_and_local_dataset_path(tmp_path):
    src = tmp_path / "gsm8k" / "main"
    src.mkdir(parents=True)
    recs = [{"question": "Ann has 2 pens and buys 3. How many?", "answer": "2+3=5\n#### 5"},
            {"question": "What is 10/4?", "answer": "#### 2.5"}]
    (src / "train-00000-of-00001.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    (src / "test-00000-of-00001.jsonl").write_text(json.dumps(recs[0]) + "\n")
    out = tmp_path / "out"
    proc = run("gsm8k.py", "--local_dataset_path", str(tmp_path / "gsm8k"), "--local_save_dir", str(out))
    assert proc.returncode == 0, proc.stderr
    train = pq.read_table(out / "train.parquet").to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in train] == ["5", "2.5"]
    assert train[0]["data_source"] == "openai/gsm8k" and train[0]["reward_model"]["style"] == "rule"
    assert len(pq.read_table(out / "test.parquet")) == 1
    # the reward the trainer applies to these rows: strict needs '#### N', flexible takes the last number
    truth = train[0]["reward_model"]["ground_truth"]
    assert default_compute_score("openai/gsm8k", "2 + 3 = 5.\n#### 5", truth) == 1.0
    assert default_compute_score("openai/gsm8k", "2 + 3 = 5.", truth) == 0.0
    assert default_compute_score("openai/gsm8k", "2 + 3 = 5.", truth, method="flexible") == 1.0


def test_gsm8k_offline_without_local_copy_says_what_to_do(tmp_path):
    proc = run("gsm8k.py", "--local_save_dir", str(tmp_path / "out"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--local_dataset_path" in proc.stderr and "HF_HUB_OFFLINE" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_gsm8k_bad_row_writes_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    (src / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    out = tmp_path / "out"
    proc = run("gsm8k.py", "--local_dataset_path", str(src), "--local_save_dir", str(out))
    assert proc.returncode != 0 and "row 0" in proc.stderr and "####" in proc.stderr
    assert not out.exists()  # train was fine, but nothing is written when test fails


def test_gsm_symbolic_deterministic_and_disjoint(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        proc = run("gsm_symbolic.py", "--local_save_dir", str(out), "--train_size", "300", "--test_size", "100")
        assert proc.returncode == 0, proc.stderr
    for split in ("train", "test"):
        assert filecmp.cmp(a / f"{split}.parquet", b / f"{split}.parquet", shallow=False)
    train = pq.read_table(a / "train.parquet").to_pylist()
    test = pq.read_table(a / "test.parquet").to_pylist()
    assert len(train) == 300 and len(test) == 100
    train_q = {r["extra_info"]["question"] for r in train}
    test_q = [r["extra_info"]["question"] for r in test]
    assert len(train_q) == 300 and len(set(test_q)) == 100 and not train_q & set(test_q)
    assert [r["extra_info"]["index"] for r in test] == list(range(100))
    # the worked solution (SFT warm-start target) ends in the rewarded format with the row's own answer
    for r in train + test:
        assert r["extra_info"]["answer"].rstrip().endswith(f"#### {r['reward_model']['ground_truth']}"), r
    row = test[0]
    assert row["data_source"] == "openai/gsm8k" and row["extra_info"]["dataset"] == "reasoning_gym/gsm_symbolic"
    assert row["prompt"][0]["content"].endswith('output the final answer after "####".')
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score(row["data_source"], f"So the answer is\n#### {truth}", truth) == 1.0
    assert default_compute_score(row["data_source"], f"<answer>{truth}</answer>", truth) == 0.0  # strict rule
    lenient = run("gsm_symbolic.py", "--local_save_dir", str(tmp_path / "c"), "--train_size", "3", "--test_size",
                  "2", "--data_source", "gsm_symbolic")
    assert lenient.returncode == 0, lenient.stderr
    row = pq.read_table(tmp_path / "c" / "test.parquet").to_pylist()[0]
    truth = row["reward_model"]["ground_truth"]
    assert default_compute_score(row["data_source"], f"<answer>{truth}</answer>", truth) == 1.0


def test_strict_and_flexible_custom_reward(tmp_path):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn({"custom_reward_function": {
        "path": str(REPO / "verl" / "utils" / "reward_score" / "gsm8k.py"),
        "name": "compute_score_strict_and_flexible"}})
    assert fn("openai/gsm8k", "3 + 4 = 7\n#### 7", "7") == {"score": 1.0, "acc": 1.0, "acc_flexible": 1.0}
    assert fn("openai/gsm8k", "3 + 4 = 7", "7") == {"score": 0.0, "acc": 0.0, "acc_flexible": 1.0}
    assert fn("openai/gsm8k", "#### 8, not 7", "7") == {"score": 0.0, "acc": 0.0, "acc_flexible": 1.0}
    assert fn("openai/gsm8k", "#### 1,000", "1000")["acc"] == 1.0


def test_basic_arithmetic_deterministic_disjoint_and_scored(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        proc = run("basic_arithmetic.py", "--local_save_dir", str(out), "--train_size", "400", "--test_size", "50")
        assert proc.returncode == 0, proc.stderr
    for split in ("train", "test"):
        assert filecmp.cmp(a / f"{split}.parquet", b / f"{split}.parquet", shallow=False)
    train = pq.read_table(a / "train.parquet").to_pylist()
    test = pq.read_table(a / "test.parquet").to_pylist()
    train_q = {r["extra_info"]["question"] for r in train}
    test_q = {r["extra_info"]["question"] for r in test}
    assert len(train_q) == 400 and len(test_q) == 50 and not train_q & test_q
    for r in train + test:
        truth, worked = r["reward_model"]["ground_truth"], r["extra_info"]["answer"]
        # the worked answer's expression evaluates to the ground truth and scores 1 under the strict rule
        expression = worked.split(" = ")[0]
        assert eval(expression, {"__builtins__": {}}) == int(truth), worked  # noqa: S307 - digits, + - ( ) only
        assert default_compute_score(r["data_source"], worked, truth) == 1.0
    assert run("basic_arithmetic.py", "--local_save_dir", str(tmp_path / "c"), "--train_size", "0").returncode == 2


def test_missing_local_copy_is_one_line_naming_it(tmp_path):
    """gsm8k.py and math_dataset.py (the shared converter) name the missing input instead of a traceback."""
    for script, args, missing in (
            ("gsm8k.py", ("--local_dataset_path", str(tmp_path / "nogsm"), "--local_save_dir", str(tmp_path / "a")),
             "nogsm"),
            ("math_dataset.py", ("--input_file", str(tmp_path / "nomath.jsonl"), "--local_dir", str(tmp_path / "b")),
             "nomath.jsonl")):
        proc = run(script, *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{script}: error:" in proc.stderr and missing in proc.stderr and "does not exist" in proc.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
