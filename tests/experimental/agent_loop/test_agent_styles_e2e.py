"""The two adapter agent styles train end to end with verl's GRPO command line (tiny model, vLLM rollout on 2 CPU
workers, rollout.mode=async, 2 steps): an OpenRLHF AgentInstance file (openrlhf_agent) and an agent function using
an OpenAI client against the loopback endpoint (openai_agent). Checks per step: the losses and scores are finite,
the scores are exactly the agents' rewards (the reward function is not used), the masked tokens are exactly the
inserted text (environment feedback / the agent's user turn), and the rollout's log-probs of the model tokens equal
the trainer's (training/rollout_probs_diff_max <= 1e-3), which fails if a masked-in token was not sampled."""

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.experimental.agent_loop.test_multiturn_e2e import run_main

pytestmark = [pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")]

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
FEEDBACK = "\nTry again.\n"  # openrlhf_test_env.FEEDBACK
RETRY = "Check your answer and reply again."  # openai_test_agents.RETRY


def make_data(root: Path, agent_name: str) -> Path:
    data = root / "data"
    subprocess.run([sys.executable, str(REPO / "examples/multiturn/calculator_data.py"), "--local_dir", str(data),
                    "--train_size", "16", "--test_size", "4", "--max_digits", "2", "--no_system_prompt",
                    "--agent_name", agent_name], check=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    return data


def args(model, data, loops, ckpt):
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        "data.train_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=96",
        "data.return_raw_chat=True",
        f"actor_rollout_ref.model.path={model}",
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
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
        "algorithm.use_kl_in_reward=False",
        "trainer.logger=[console,file]", "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
        "trainer.save_freq=-1", "trainer.test_freq=-1",
        f"trainer.default_local_dir={ckpt}",
        "trainer.total_training_steps=2",
    ]


@pytest.fixture(scope="module")
def tok():
    from verl.utils.embedded.tokenizer import load_tokenizer

    return load_tokenizer()


def check_common(metrics, rewards):
    assert sorted(metrics) == [1, 2]
    for step, m in metrics.items():
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "critic/advantages/mean"):
            assert math.isfinite(m[key]), (step, key, m[key])
        assert m["training/rollout_probs_diff_max"] <= 1e-3, (step, m["training/rollout_probs_diff_max"])
        # every score is one of the agent's rewards (the reward function would give 0 or 1)
        for key in ("critic/score/min", "critic/score/max"):
            assert min(abs(m[key] - r) for r in rewards) < 1e-5, (step, key, m[key])
        assert m["agent_loop/agent_reward/mean"] == pytest.approx(m["critic/score/mean"], abs=1e-5)
        assert m["num_turns/min"] == m["num_turns/max"] == 4  # prompt, model, inserted text, model
        assert 0 < m["response_length/mean"] <= 48  # model tokens only: two turns of at most 24


def test_openrlhf_agent_file_trains(tmp_path, tok):
    from verl.utils.embedded import make_model_dir

    loops = tmp_path / "agent_loops.yaml"
    loops.write_text("- name: counting_env\n  _target_: verl.experimental.agent_loop.OpenRLHFAgentLoop\n"
                     f"  agent_func_path: {HERE / 'openrlhf_test_env.py'}\n  max_tokens_per_turn: 24\n")
    model = make_model_dir(str(tmp_path / "model"), size="tiny", seed=0)
    data = make_data(tmp_path, "counting_env")
    metrics, _ = run_main(tmp_path / "run", args(model, data, loops, tmp_path / "ckpt"))
    check_common(metrics, rewards=(0.35, 0.85))  # 0.1 for the first step + 0.25 or 0.75 for the second
    feedback = len(tok.encode(FEEDBACK, add_special_tokens=False))
    for m in metrics.values():  # exactly the feedback tokens are masked out, in every episode
        assert m["agent_loop/masked_tokens/mean"] == m["agent_loop/masked_tokens/max"] == feedback


def test_openai_client_agent_trains(tmp_path, tok):
    from verl.utils.embedded import make_model_dir

    loops = tmp_path / "agent_loops.yaml"
    loops.write_text("- name: chat_agent\n  _target_: verl.experimental.agent_loop.OpenAIAgentLoop\n"
                     f"  agent_func_path: {HERE / 'openai_test_agents.py'}\n  agent_func_name: two_turns\n")
    model = make_model_dir(str(tmp_path / "model"), size="tiny", seed=0)
    data = make_data(tmp_path, "chat_agent")
    metrics, _ = run_main(tmp_path / "run", args(model, data, loops, tmp_path / "ckpt"))
    check_common(metrics, rewards=(0.25, 0.75))
    # the inserted user turn: its template tokens, with the end-of-turn token unless the model sampled it itself
    turn = "<|im_end|>\n<|im_start|>user\n" + RETRY + "<|im_end|>\n<|im_start|>assistant\n"
    longest = len(tok.encode(turn, add_special_tokens=False))
    shortest = len(tok.encode(turn[len("<|im_end|>"):], add_special_tokens=False))
    for m in metrics.values():
        assert shortest <= m["agent_loop/masked_tokens/mean"] <= longest
        assert m["agent_loop/masked_tokens/max"] in (shortest, longest)
