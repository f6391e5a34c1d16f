"""verl's multi-turn GRPO command line on the tiny model with the vLLM rollout (2 CPU workers): rollout.mode=async,
multi_turn.enable=True, a tool config file, data rows with agent_name (tool_agent, and an extra loop registered
through agent.agent_loop_config_path that opens every episode with a real calculator call). Checks: the run
trains, tool turns appear (num_turns, tool calls, mask-0 tokens), the rollout's log-probs on multi-turn samples
match the trainer's after every weight push (training/rollout_probs_diff_max <= 1e-3, fp32), a checkpoint is
written and a second run resumes from it."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")]

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    import pyarrow.parquet as pq

    from verl.utils.embedded import make_model_dir

    root = tmp_path_factory.mktemp("multiturn")
    data = root / "data"
    subprocess.run([sys.executable, str(REPO / "examples/multiturn/calculator_data.py"), "--local_dir", str(data),
                    "--train_size", "16", "--test_size", "4", "--max_digits", "2", "--no_system_prompt"],
                   check=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    table = pq.read_table(data / "train.parquet").to_pylist()
    for i, row in enumerate(table):  # every other row: the loop that opens with a real tool call
        row["agent_name"] = "forced_call_agent" if i % 2 else "tool_agent"
    import pyarrow as pa
    pq.write_table(pa.Table.from_pylist(table), data / "train.parquet")
    loops = root / "agent_loops.yaml"
    loops.write_text("- name: forced_call_agent\n"
                     "  _target_: tests.experimental.agent_loop.forced_call_agent.ForcedCallAgentLoop\n")
    return {"model": make_model_dir(str(root / "model"), size="tiny", seed=0), "train": data / "train.parquet",
            "test": data / "test.parquet", "loops": loops}


def args(a, ckpt_dir, steps, *extra):
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={a['train']}", f"data.val_files={a['test']}",
        "data.train_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=160",
        "data.return_raw_chat=True",
        f"actor_rollout_ref.model.path={a['model']}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.fsdp_config.dtype=fp32",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.max_num_seqs=64",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path="
        f"{REPO / 'examples/multiturn/config/tool_config/calculator_tool_config.yaml'}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={a['loops']}",
        "algorithm.use_kl_in_reward=False",
        "trainer.logger=[console,file]", "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
        "trainer.save_freq=2", "trainer.test_freq=-1",
        f"trainer.default_local_dir={ckpt_dir}",
        f"trainer.total_training_steps={steps}",
        *extra,
    ]


def run_main(run_dir: Path, argv):
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(run_dir / "metrics.jsonl"),
               PYTHONUNBUFFERED="1", VLLM_CPU_KVCACHE_SPACE="1")
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *argv], cwd=run_dir, env=env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=900)
    text = (run_dir / "log.txt").read_text()
    assert proc.returncode == 0, text[-6000:]
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "data" in record:
            steps.setdefault(record["step"], {}).update(record["data"])
    return steps, text


def test_multiturn_grpo_vllm_trains_checkpoints_and_resumes(assets, tmp_path):
    ckpt = tmp_path / "ckpt"
    metrics, _ = run_main(tmp_path / "first", args(assets, ckpt, 2))
    assert sorted(metrics) == [1, 2]
    for step, m in metrics.items():
        assert m["training/rollout_probs_diff_max"] <= 1e-3, (step, m["training/rollout_probs_diff_max"])
        # half the rows open with a tool call: 4 turns; the others are tool_agent episodes (>= 2 turns)
        assert m["num_turns/max"] >= 4 and m["num_turns/min"] >= 2
        assert m["agent_loop/tool_calls/mean"] >= 0.5 and m["agent_loop/tool_errors/sum"] >= 0
        assert m["response_length/mean"] > 0
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    resumed, text = run_main(tmp_path / "second", args(assets, ckpt, 3))
    assert "Resuming from" in text and sorted(resumed) == [3]
    assert resumed[3]["training/rollout_probs_diff_max"] <= 1e-3
