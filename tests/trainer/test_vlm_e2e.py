"""GRPO on a tiny Qwen2-VL with images, end to end through ``python -m verl.trainer.main_ppo`` (fp32, CPU).

The embedded colour task (name the colour of the square in the image) with data.image_key=images: 2 steps
with the HF rollout, finite metrics, rollout log-probs equal to the trainer's after each weight push (the images
reached both), and a bad image row that stops the run before anything is written.
"""

import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.utils.embedded.colours import make_rl_rows, write_parquet
from verl.utils.embedded.vlm import make_vlm_model_dir

REPO = Path(__file__).resolve().parents[2]
# the colour task's rule reward is all zeros for a random model; this one varies (so GRPO has a gradient): the
# share of response characters that occur in the right colour's name
REWARD_PY = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(ch in ground_truth for ch in solution_str) / max(1, len(solution_str))
"""


def _args(data_dir, model, rollout="hf", extra=()):
    reward = data_dir / "reward.py"
    reward.write_text(REWARD_PY)
    return [
        "algorithm.adv_estimator=grpo", f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'test.parquet'}", "data.image_key=images", "data.train_batch_size=8",
        "data.max_prompt_length=64", "data.max_response_length=8", f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.fsdp_config.dtype=fp32", f"actor_rollout_ref.rollout.name={rollout}",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={reward}", "trainer.logger=[console,file]", "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.total_training_steps=2", *extra,
    ]


def _run(tmp_path, args, name="run"):
    run_dir = tmp_path / name
    run_dir.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(run_dir / "metrics.jsonl"),
               PYTHONUNBUFFERED="1", VLLM_CPU_KVCACHE_SPACE="1")
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=run_dir, env=env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=900)
    return proc.returncode, (run_dir / "log.txt").read_text(), run_dir


def _steps(run_dir):
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "data" in record:
            steps.setdefault(record["step"], {}).update(record["data"])
    return steps


@pytest.fixture
def colour_data(tmp_path):
    data = tmp_path / "data"
    write_parquet(make_rl_rows(16, "train"), str(data / "train.parquet"))
    write_parquet(make_rl_rows(8, "test"), str(data / "test.parquet"))
    return data


@pytest.mark.e2e
def test_grpo_tiny_vlm_hf_rollout(tmp_path, colour_data):
    model = make_vlm_model_dir(str(tmp_path / "vlm"), seed=0)
    # verl's run_qwen2_5_vl-7b_freeze_vision.sh setting: the vision encoder is frozen, the language model trains
    code, text, run_dir = _run(tmp_path, _args(colour_data, model,
                                               extra=("actor_rollout_ref.actor.freeze_vision_tower=True",)))
    assert code == 0, text[-6000:]
    assert re.search(r"actor: freeze_vision_tower: [1-9]\d* vision-tower parameter tensors frozen", text), text[-3000:]
    steps = _steps(run_dir)
    assert sorted(steps) == [1, 2], text[-3000:]
    for step, m in steps.items():
        finite = {k: v for k, v in m.items() if isinstance(v, (int, float))}
        assert all(math.isfinite(v) for v in finite.values()), (step, finite)
        assert m["training/rollout_probs_diff_max"] <= 1e-4, (step, m["training/rollout_probs_diff_max"])
        assert m["response_length/mean"] > 0
    assert any(m.get("actor/grad_norm", 0) > 0 for m in steps.values())


@pytest.mark.e2e
def test_undecodable_image_stops_the_run_before_anything_is_written(tmp_path, colour_data):
    rows = make_rl_rows(16, "train")
    rows[5]["images"] = [{"bytes": b"not an image"}]
    pq.write_table(pa.Table.from_pylist(rows), str(colour_data / "train.parquet"))
    model = make_vlm_model_dir(str(tmp_path / "vlm"), seed=0)
    ckpt = tmp_path / "ckpt"
    code, text, run_dir = _run(tmp_path, _args(colour_data, model, extra=[f"trainer.default_local_dir={ckpt}",
                                                                          "trainer.save_freq=1"]))
    assert code != 0
    assert "image 0 of column 'images' (data.image_key) cannot be decoded" in text, text[-3000:]
    assert f"row {next(i for i, r in enumerate(pq.read_table(str(colour_data / 'train.parquet')).to_pylist()) if r['images'][0]['bytes'] == b'not an image')} of" in text
    assert not ckpt.exists()
    assert not (run_dir / "metrics.jsonl").exists() or not _steps(run_dir)
