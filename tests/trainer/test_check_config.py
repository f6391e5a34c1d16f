"""``python -m verl.trainer.main_ppo --check-config ...``: the driver's checks without starting anything."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.validator_assets import run_check_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from verl.utils.embedded import make_model_dir

    root = tmp_path_factory.mktemp("check_config")
    subprocess.run([sys.executable, str(REPO / "examples/data_preprocess/arithmetic.py"), "--local_dir",
                    str(root / "data"), "--train_size", "16", "--test_size", "4"], check=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True)
    return {"model": make_model_dir(str(root / "model"), size="tiny"), "data": root / "data"}


def _check(tmp_path, a, *extra):
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    args = [f"data.train_files={a['data'] / 'train.parquet'}", f"data.val_files={a['data'] / 'test.parquet'}",
            f"actor_rollout_ref.model.path={a['model']}", "actor_rollout_ref.rollout.name=hf",
            "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
            "trainer.n_gpus_per_node=2", *extra]
    result = run_check_config(run_dir, args)
    assert not any(run_dir.iterdir()), list(run_dir.iterdir())  # nothing written, nothing started
    return result


def test_good_config_is_ok_and_shows_the_resolved_defaults(assets, tmp_path):
    rc, out = _check(tmp_path, assets)
    assert rc == 0 and out.rstrip().endswith("config ok"), out[-3000:]
    # verl's default rollout engine size applied as documented for the HF rollout
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size: 2 -> 1" in out, out[-3000:]


@pytest.mark.parametrize("override,expected", [
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=4",
     "actor_rollout_ref.rollout.tensor_model_parallel_size=4 with actor_rollout_ref.rollout.name=hf"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=8", "ppo_mini_batch_size=8 must be between 1"),
    ("actor_rollout_ref.rollout.nn=2", "actor_rollout_ref.rollout.nn"),
])
def test_bad_config_exits_2_with_the_key(assets, tmp_path, override, expected):
    rc, out = _check(tmp_path, assets, override)
    assert rc == 2 and "Config error:" in out and expected in out, out[-3000:]
    assert "config ok" not in out
