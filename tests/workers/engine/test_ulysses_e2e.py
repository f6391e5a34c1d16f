"""Ulysses sequence parallel through ``python -m verl.trainer.main_ppo`` and its config checks.

- config: ``ulysses_sequence_parallel_size`` is accepted for actor / ref / critic; sizes that do not divide the
  processes or the model's (kv) heads, and SP without ``use_remove_padding``, are refused before workers start
  with the key in the message;
- e2e: PPO with a critic and a KL-loss reference on 2 ranks with SP=2 for all three (one data-parallel group
  whose sequences are split over both ranks). The hybrid engine's HF rollout samples with the full model, the
  trainer scores the same tokens with the sequence-parallel forward: their probabilities agree at fp32
  rounding every step.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from verl.trainer.config_schema import validate_ppo_config
from verl.utils.config import ConfigError

REPO = Path(__file__).resolve().parents[3]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")
SP_KEYS = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
           "critic.ulysses_sequence_parallel_size=2", "critic.model.use_remove_padding=True")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    import pandas as pd

    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import make_rl_rows

    root = tmp_path_factory.mktemp("sp_assets")
    model = make_model_dir(str(root / "model"), size="tiny", seed=0)  # 4 heads, 2 kv heads
    pd.DataFrame(make_rl_rows(16, "train", seed=0)).to_parquet(root / "train.parquet")
    pd.DataFrame(make_rl_rows(8, "test", seed=1)).to_parquet(root / "test.parquet")
    (root / "reward.py").write_text(textwrap.dedent('''
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return sum(ch.isdigit() for ch in solution_str) / max(1, len(solution_str))
    '''))
    return {"model": model, "train": root / "train.parquet", "test": root / "test.parquet",
            "reward": root / "reward.py"}


def ppo_args(a, gpus=2):
    return [
        f"data.train_files={a['train']}", f"data.val_files={a['test']}", "data.train_batch_size=8",
        "data.max_prompt_length=32", "data.max_response_length=16", f"actor_rollout_ref.model.path={a['model']}",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.fsdp_config.dtype=fp32", "actor_rollout_ref.ref.fsdp_config.dtype=fp32",
        "critic.optim.lr=1e-3", f"critic.model.path={a['model']}", "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.model.fsdp_config.dtype=fp32", f"custom_reward_function.path={a['reward']}",
        "trainer.logger=[console,file]", "trainer.val_before_train=False", f"trainer.n_gpus_per_node={gpus}",
        "trainer.nnodes=1", "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.total_training_steps=2",
    ]


def composed(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_sp2_config_is_accepted(assets):
    plan = validate_ppo_config(composed(ppo_args(assets) + list(SP_KEYS)))
    assert plan.use_critic and plan.n_gpus == 2


@pytest.mark.parametrize("extra, pattern", [
    (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=3"],
     r"actor_rollout_ref\.actor\.ulysses_sequence_parallel_size=3 must divide the number of processes \(2\)"),
    (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "actor_rollout_ref.model.use_remove_padding=False"],
     r"actor_rollout_ref\.actor\.ulysses_sequence_parallel_size=2 needs actor_rollout_ref\.model\.use_remove_padding"),
    (["critic.ulysses_sequence_parallel_size=2", "critic.model.use_remove_padding=False"],
     r"critic\.ulysses_sequence_parallel_size=2 needs critic\.model\.use_remove_padding=True"),
    (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=4", "trainer.n_gpus_per_node=4"],
     r"ulysses_sequence_parallel_size=4 must divide the model's number of key/value heads \(2\)"),
    (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
      "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1"],
     r"actor_rollout_ref\.ref\.ulysses_sequence_parallel_size"),
])
def test_bad_sp_sizes_are_refused_naming_the_key(assets, extra, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate_ppo_config(composed(ppo_args(assets) + extra))


@pytest.mark.e2e
def test_ppo_with_sp2_actor_ref_critic(assets, tmp_path):
    run_dir = tmp_path / "sp2"
    run_dir.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(run_dir / "metrics.jsonl"),
               PYTHONUNBUFFERED="1")
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *ppo_args(assets), *SP_KEYS],
                              cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900)
    assert proc.returncode == 0, (run_dir / "log.txt").read_text()[-6000:]
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "data" in record:
            steps.setdefault(record["step"], {}).update(record["data"])
    assert sorted(steps) == [1, 2]
    for step, m in steps.items():
        assert m["training/rollout_probs_diff_max"] < 1e-3, (step, m["training/rollout_probs_diff_max"])
        for name in ("actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "critic/values/mean"):
            assert name in m, (step, name)
    assert any(m["actor/grad_norm"] > 0 for m in steps.values())
