"""DeepSeek-V3 (multi-latent attention, grouped expert routing, a shared expert) through verl's Megatron command
line on CPU: ``main_ppo --config-name=ppo_megatron_trainer``, GRPO, 2 steps, two processes, EP=2 (4 of the 8 routed
experts each), fp32, ``rollout.name=hf`` (vLLM's CPU backend cannot decode multi-latent attention). After every
weight push (Megatron -> HF names: the low-rank query/key-value projections, the router's correction bias, the
shared and the routed experts from the expert-parallel rank that holds them) the HF rollout's log-probs of the
sampled tokens equal the Megatron trainer's (``training/rollout_probs_diff_max`` <= 1e-3; measured 9.9e-5 and
1.8e-5). The HF rollout starts from the checkpoint, so step 2 (after an update with gradient norm ~0.7 at lr 1e-2)
is the step that shows the push."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_megatron_moe_e2e import REPO, REWARD_PY  # noqa: E402

from verl.utils.embedded.moe import make_moe_model_dir  # noqa: E402


def _deepseek_dir(tmp_path: Path) -> Path:
    """The tiny DeepSeek-V3 of the engine tests, with the embedded tokenizer and its special tokens."""
    from test_megatron_deepseek import make_deepseek_dir

    from transformers import AutoConfig

    tokenizer_dir = Path(make_moe_model_dir(str(tmp_path / "tok"), seed=0))
    path = Path(make_deepseek_dir(str(tmp_path / "deepseek")))
    moe = AutoConfig.from_pretrained(tokenizer_dir)
    config = json.loads((path / "config.json").read_text())
    config.update(pad_token_id=moe.pad_token_id, bos_token_id=moe.bos_token_id, eos_token_id=moe.eos_token_id)
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").unlink(missing_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, path / f.name)
    return path


@pytest.mark.e2e
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_megatron_deepseek_ep2_grpo_hf_rollout_in_sync(tmp_path):
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "examples/data_preprocess/arithmetic.py"), "--local_dir", str(data),
                    "--train_size", "32", "--test_size", "8"], check=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    (tmp_path / "reward.py").write_text(REWARD_PY)
    model = _deepseek_dir(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    args = [
        "--config-name=ppo_megatron_trainer",
        "algorithm.adv_estimator=grpo", f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}", "data.train_batch_size=8", "data.max_prompt_length=48",
        "data.max_response_length=16", f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={tmp_path / 'reward.py'}", "trainer.logger=[console,file]",
        "trainer.val_before_train=False", "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
        "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.total_training_steps=2",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(run_dir / "metrics.jsonl"),
               PYTHONUNBUFFERED="1")
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=run_dir, env=env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=900)
    text = (run_dir / "log.txt").read_text()
    assert proc.returncode == 0, text[-6000:]
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "data" in record:
            steps.setdefault(record["step"], {}).update(record["data"])
    assert sorted(steps) == [1, 2]
    for step, m in steps.items():
        assert m["training/rollout_probs_diff_max"] <= 1e-3, (step, m["training/rollout_probs_diff_max"])
        assert m["response_length/mean"] > 0
    assert any(m.get("actor/grad_norm", 0) > 0 for m in steps.values())
