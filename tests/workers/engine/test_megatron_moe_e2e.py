"""verl's Megatron command line with a mixture-of-experts model, expert parallel and LoRA on CPU: ``main_ppo
--config-name=ppo_megatron_trainer``, GRPO, 2 steps, two processes, EP=2 (each holds 2 of the 4 experts of the
embedded tiny Qwen3-MoE), verl's Qwen3-MoE LoRA example keys (``model.lora.rank=32``, ``alpha=64``, kaiming A:
adapters on attention and every expert), fp32, and the rollout laid out like verl's expert-parallel examples: one
vLLM engine over both processes (``rollout.data_parallel_size=2``, ``expert_parallel_size=2``, each engine rank
holding 2 of the experts), batch generation (``rollout.mode=sync``). After every weight push (merged per-expert HF
tensors broadcast from the training rank that holds them, each engine rank keeping its own experts) vLLM's
log-probs of the sampled tokens equal the trainer's (``training/rollout_probs_diff_max`` <= 1e-3); the step-2 push
carries the first update, which moved the adapters only. About 30 s on a 2-core machine."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "trainer"))
from test_main_ppo_vllm import REPO, REWARD_PY, run_main  # noqa: E402

from verl.models.mcore.lora import LORA_FILE  # noqa: E402
from verl.utils.embedded.moe import make_moe_model_dir  # noqa: E402


def megatron_grpo_args(tmp_path: Path, model, *extra, save_freq: int = -1) -> list[str]:
    """GRPO on the arithmetic data with verl's Megatron command line, two processes, EP=2, 2 steps."""
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "examples/data_preprocess/arithmetic.py"), "--local_dir", str(data),
                    "--train_size", "32", "--test_size", "8"], check=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    (tmp_path / "reward.py").write_text(REWARD_PY)
    return [
        "--config-name=ppo_megatron_trainer",
        "algorithm.adv_estimator=grpo", f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}", "data.train_batch_size=8", "data.max_prompt_length=48",
        "data.max_response_length=16", f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "algorithm.use_kl_in_reward=False", f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "trainer.logger=[console,file]", "trainer.val_before_train=False", "trainer.n_gpus_per_node=2",
        "trainer.nnodes=1", f"trainer.save_freq={save_freq}", "trainer.test_freq=-1", "trainer.total_training_steps=2", *extra,
    ]


def assert_in_sync_two_steps(steps: dict) -> None:
    assert sorted(steps) == [1, 2]
    for step, m in steps.items():
        assert m["training/rollout_probs_diff_max"] <= 1e-3, (step, m["training/rollout_probs_diff_max"])
        assert m["response_length/mean"] > 0
    assert any(m.get("actor/grad_norm", 0) > 0 for m in steps.values())


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_megatron_moe_ep2_grpo_vllm_in_sync(tmp_path):
    model = make_moe_model_dir(str(tmp_path / "moe"), seed=0)
    run_dir = tmp_path / "run"
    steps = run_main(run_dir, megatron_grpo_args(
        tmp_path, model,
        "actor_rollout_ref.model.lora.rank=32", "actor_rollout_ref.model.lora.alpha=64",
        "actor_rollout_ref.model.lora.lora_A_init_method=kaiming",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.load_format=dummy",  # step 1 is only right if the first push happened
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.data_parallel_size=2",
        "actor_rollout_ref.rollout.expert_parallel_size=2", "actor_rollout_ref.rollout.mode=sync",
        "actor_rollout_ref.rollout.max_num_seqs=64", save_freq=2))
    text = (run_dir / "log.txt").read_text()
    assert "data-parallel rank 1 of 2 in one engine" in text, text[-4000:]
    assert_in_sync_two_steps(steps)
    # the actor trained adapters: its checkpoint records the LoRA settings the model merger rebuilds them from
    saved = list(run_dir.glob(f"checkpoints/*/*/global_step_2/actor/**/{LORA_FILE}"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["rank"] == 32, saved
