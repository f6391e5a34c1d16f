"""examples/multiturn/calculator_sft_data.py writes tool-use conversations the multi-turn SFT dataset trains on
(loss on the model's turns only), on problems disjoint from the RL test split; calculator_reward.py scores a
tool_agent episode by its final answer and counts its tool calls."""

import importlib.util
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from verl.experimental.agent_loop.tool_parser import HermesToolParser
from verl.tools.calculator_tool import safe_eval
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
from verl.utils.embedded import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples", "multiturn")


def load(name):
    spec = importlib.util.spec_from_file_location(f"multiturn_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(script, *args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("calc")
    res = run("calculator_data.py", "--local_dir", str(root / "rl"), "--train_size", "8", "--test_size", "60",
              "--max_digits", "1", "--no_system_prompt")
    assert res.returncode == 0, res.stderr
    # one-digit operands: only 100 distinct products exist, so the exclusion is really exercised
    res = run("calculator_sft_data.py", "--local_dir", str(root / "sft"), "--exclude", str(root / "rl/test.parquet"),
              "--train_size", "20", "--val_size", "4", "--max_digits", "1", "--direct_share", "0.25",
              "--no_system_prompt", "--seed", "3")
    assert res.returncode == 0, res.stderr
    return root


def test_rows_are_well_formed_tool_conversations(data):
    rows = pq.read_table(data / "sft/train.parquet").to_pylist()
    val = pq.read_table(data / "sft/val.parquet").to_pylist()
    assert len(rows) == 20 and len(val) == 4
    parser = HermesToolParser(None)
    kinds = set()
    for row in rows + val:
        messages, info = row["messages"], row["extra_info"]
        expression, answer = info["expression"], info["answer"]
        assert messages[0] == {"role": "user", "content": expression + "="}
        assert messages[-1] == {"role": "assistant", "content": answer}
        assert int(answer) == safe_eval(expression)
        kinds.add(info["kind"])
        if info["kind"] == "tool":
            assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
            content, calls, errors = parser.parse(messages[1]["content"])
            assert content == "" and not errors and len(calls) == 1 and calls[0].name == "calculator"
            assert json.loads(calls[0].arguments) == {"expression": expression}
            assert messages[2]["content"] == answer
        else:
            assert [m["role"] for m in messages] == ["user", "assistant"]
    assert kinds == {"tool", "direct"}


def test_problems_are_disjoint_from_the_rl_test_split(data):
    test = {r["extra_info"]["expression"] for r in pq.read_table(data / "rl/test.parquet").to_pylist()}
    train = [r["extra_info"]["expression"] for r in pq.read_table(data / "sft/train.parquet").to_pylist()]
    val = [r["extra_info"]["expression"] for r in pq.read_table(data / "sft/val.parquet").to_pylist()]
    assert len(test) > 30  # a large share of the 100 one-digit products is excluded
    assert not test & set(train + val)
    assert len(set(train + val)) == len(train + val)  # no problem repeats, train and val disjoint


def test_sft_dataset_trains_on_the_model_turns_only(data):
    tok = load_tokenizer()
    ds = MultiTurnSFTDataset(str(data / "sft/train.parquet"), tok,
                             OmegaConf.create({"max_length": 192, "multiturn": {"enable": True}}))
    rows = pq.read_table(data / "sft/train.parquet").to_pylist()
    i = next(k for k, r in enumerate(rows) if r["extra_info"]["kind"] == "tool")
    item, expression, answer = ds[i], rows[i]["extra_info"]["expression"], rows[i]["extra_info"]["answer"]
    trained = tok.decode(item["input_ids"][item["loss_mask"].bool()])
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expression
    assert trained == f"{call}<|im_end|>{answer}<|im_end|>"  # tool result and prompts get no loss


def test_exclusion_that_leaves_too_few_problems_fails_clearly(data):
    res = run("calculator_sft_data.py", "--local_dir", str(data / "x"), "--exclude", str(data / "rl/test.parquet"),
              "--train_size", "200", "--max_digits", "1", "--no_system_prompt")
    assert res.returncode == 2 and "new problems" in res.stderr and "Traceback" not in res.stderr and not (data / "x/train.parquet").exists()
    res = run("calculator_sft_data.py", "--local_dir", str(data / "x"), "--direct_share", "1.5")
    assert res.returncode == 2 and "--direct_share" in res.stderr
    res = run("calculator_sft_data.py", "--local_dir", str(data / "x"), "--min_digits", "3", "--max_digits", "2")
    assert res.returncode == 2 and "min_digits" in res.stderr and "Traceback" not in res.stderr


def test_fixed_width_operands(tmp_path):
    res = run("calculator_sft_data.py", "--local_dir", str(tmp_path), "--train_size", "16", "--val_size", "0",
              "--min_digits", "3", "--max_digits", "3")
    assert res.returncode == 0, res.stderr
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert not (tmp_path / "val.parquet").exists()
    for row in rows:
        a, b = row["extra_info"]["expression"].split("*")
        assert len(a) == len(b) == 3 and row["messages"][0]["role"] == "system"  # system prompt by default


def test_reward_scores_the_final_answer_and_counts_tool_use():
    reward = load("calculator_reward")
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>'
    good = f"{call}\ntool\n5535\nassistant\n5535"
    # the built-in rule would read 123 (the first integer); the final answer is what counts
    assert reward.compute_score("arithmetic", good, "5535", {"num_turns": 4}) == {
        "score": 1.0, "acc": 1.0, "tool_calls": 1, "tool_ok": 1, "tool_errors": 0, "tool_right": 1, "num_turns": 4.0}
    wrong_call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123*54"}}</tool_call>'
    r = reward.compute_score("arithmetic", f"{wrong_call}\ntool\n6642\nassistant\n6642", "5535")
    assert (r["score"], r["tool_ok"], r["tool_right"]) == (0.0, 1, 0) and "num_turns" not in r
    bad = '<tool_call>{"name": "calculator", "arguments": {"expression": "123*45"</tool_call>'
    r = reward.compute_score("arithmetic", f"{bad}\ntool\nError: not valid JSON\nassistant\n{call}"
                                           f"\ntool\n5535\nassistant\n5535", "5535")
    assert (r["score"], r["tool_calls"], r["tool_ok"], r["tool_errors"], r["tool_right"]) == (1.0, 2, 1, 1, 1)
    assert reward.compute_score("arithmetic", "5535", "5535")["score"] == 1.0  # direct answer, no tool
    # an episode that ends on a call (no room for the result) has no answer, even if the call holds the number
    r = reward.compute_score("arithmetic", '<tool_call>{"name": "calculator", "arguments": {"expression": "5535*1"',
                             "5535")
    assert (r["score"], r["tool_calls"], r["tool_ok"]) == (0.0, 1, 0)
