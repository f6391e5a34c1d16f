"""examples/data_preprocess/*.py write verl-schema parquet that RLHFDataset / SFTDataset load, offline."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from verl.utils.dataset import RLHFDataset, SFTDataset
from verl.utils.embedded import load_tokenizer
from verl.utils.reward_score.arithmetic import compute_score

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "examples", "data_preprocess")
RL_CFG = OmegaConf.create(
    {"prompt_key": "prompt", "max_prompt_length": 512, "truncation": "error", "return_raw_chat": True}
)


def run_script(name, *args, expect_ok=True):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run(
        [sys.executable, os.path.join(SCRIPTS, name), *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert (res.returncode == 0) == expect_ok, res.stderr
    return res


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"preprocess_{name}", os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_arithmetic_script(tmp_path, tok):
    out = tmp_path / "arith"
    run_script(
        "arithmetic.py",
        "--local_dir",
        str(out),
        "--train_size",
        "64",
        "--test_size",
        "16",
        "--max_digits",
        "1",
        "--operators",
        "+-*",
        "--sft",
    )
    train = pq.read_table(out / "train.parquet").to_pylist()
    test = pq.read_table(out / "test.parquet").to_pylist()
    assert len(train) == 64 and len(test) == 16
    assert not {r["extra_info"]["expression"] for r in test} & {r["extra_info"]["expression"] for r in train}
    assert [r["extra_info"]["index"] for r in test] == list(range(16))
    ds = RLHFDataset([str(out / "train.parquet"), str(out / "test.parquet")], tok, RL_CFG)
    assert len(ds) == 80
    item = ds[0]
    assert item["data_source"] == "arithmetic" and item["raw_prompt"][0]["content"].endswith("=")
    truth = item["reward_model"]["ground_truth"]
    assert compute_score(truth + "<|im_end|>", truth) == 1.0
    sft = SFTDataset(
        str(out / "sft" / "train.parquet"),
        tok,
        OmegaConf.create({"prompt_key": "prompt", "response_key": "response", "max_length": 32}),
    )
    assert len(sft) == 64 and sft[0]["loss_mask"].sum() == len(train[0]["reward_model"]["ground_truth"]) + 1
    bad = run_script("arithmetic.py", "--local_dir", str(out), "--operators", "+%", expect_ok=False)
    assert bad.returncode == 2 and "operators must be" in bad.stderr and "Traceback" not in bad.stderr


def test_gsm_symbolic_script(tmp_path, tok):
    out = tmp_path / "gs"
    run_script("gsm_symbolic.py", "--local_dir", str(out), "--train_size", "6", "--test_size", "3", "--seed", "1")
    ds = RLHFDataset(str(out / "train.parquet"), tok, RL_CFG)
    assert len(ds) == 6
    row = ds[0]
    assert row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"].lstrip("-").isdigit()
    assert row["raw_prompt"][0]["content"].endswith('output the final answer after "####".')
    assert len(pq.read_table(out / "test.parquet")) == 3


def test_gsm8k_script_from_local_files(tmp_path, tok, capsys):
    src = tmp_path / "gsm8k_src" / "main"
    src.mkdir(parents=True)
    recs = [
        {"question": "Tom has 3 apples and buys 1,200 more. How many?", "answer": "3+1200=1203\n#### 1,203"},
        {"question": "What is 2-5?", "answer": "#### -3"},
    ]
    with open(src / "train.jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in recs) + "\n")
    with open(src / "test.json", "w") as f:
        json.dump(recs[:1], f)
    gsm8k = load_script("gsm8k")
    out = tmp_path / "gsm8k"
    written = gsm8k.main(["--local_dataset_path", str(tmp_path / "gsm8k_src"), "--local_dir", str(out)])
    assert sorted(os.path.basename(p) for p in written) == ["test.parquet", "train.parquet"]
    ds = RLHFDataset(str(out / "train.parquet"), tok, RL_CFG)
    assert [ds[i]["reward_model"]["ground_truth"] for i in range(2)] == ["1203", "-3"]
    assert ds[0]["data_source"] == "openai/gsm8k" and ds[0]["extra_info"]["answer"] == recs[0]["answer"]
    assert (
        ds[0]["raw_prompt"][0]["content"]
        == recs[0]["question"] + ' Let\'s think step by step and output the final answer after "####".'
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(SystemExit) as exit_info:  # one line on stderr naming the file and row, exit code 2
        gsm8k.main(["--input_file", str(bad), "--local_dir", str(out)])
    assert exit_info.value.code == 2 and re.search(r"bad\.jsonl, row 0.*####", capsys.readouterr().err)
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"problem": "q", "solution": "s"}) + "\n")
    with pytest.raises(KeyError, match="question"):
        gsm8k.main(["--input_file", str(wrong), "--local_dir", str(out)])


def test_math_script_from_local_file(tmp_path, tok):
    import pyarrow as pa

    src = tmp_path / "math_test.parquet"
    recs = [
        {"problem": "Simplify $\\frac{2}{4}$.", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
        {"problem": "Compute 1+1.", "solution": "First \\boxed{3}, no: \\boxed{2}"},
        {"problem": "x?", "solution": "So $\\boxed 5$."},
    ]
    pq.write_table(pa.Table.from_pylist(recs), str(src))
    math_dataset = load_script("math_dataset")
    out = tmp_path / "math"
    math_dataset.main(["--input_file", str(src), "--split", "test", "--local_dir", str(out)])
    ds = RLHFDataset(str(out / "test.parquet"), tok, RL_CFG)
    assert [ds[i]["reward_model"]["ground_truth"] for i in range(3)] == ["\\frac{1}{2}", "2", "5"]
    assert ds[0]["data_source"] == "DigitalLearningGmbH/MATH-lighteval" and ds[0]["extra_info"]["split"] == "test"
    assert ds[0]["raw_prompt"][0]["content"].endswith("output the final answer within \\boxed{}.")
