"""Megatron checkpoints through dist-checkpointing: resumable on another layout, and mergeable into HF.

A TP=2 (or PP=2) run takes one PPO step, saves, takes a second step. A TP=1/PP=1 run over the same two
processes (data parallel 2, distributed optimizer) loads the checkpoint and takes the same second step: its
weights must equal the first run's (the model *and* the Adam moments were restored, or the step would
differ). The merger turns the checkpoint into an HF directory whose logits give the engine's log-probs.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import actor_config, make_batch, make_model_dir, run_distributed  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.workers.actor.dp_actor import DataParallelPPOActor  # noqa: E402
from verl.workers.engine.config import EngineConfig  # noqa: E402

pytest.importorskip("megatron.core")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TOL = 1e-5


def _batch(seed: int) -> DataProto:
    return DataProto.from_dict(make_batch(bsz=4, prompt_len=6, resp_len=5, seed=seed, with_ref=False))


def _engine(model_dir, tp, pp):
    from verl.workers.config import FSDPOptimizerConfig
    from verl.workers.engine import get_engine_cls

    cfg = EngineConfig(model_path=model_dir, name="actor", strategy="megatron",
                       megatron={"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp},
                       optim=FSDPOptimizerConfig(lr=1e-3, weight_decay=0.01), grad_clip=1.0, total_training_steps=10)
    return get_engine_cls("megatron").build(cfg)


def _actor(engine):
    dp = engine.dp_size
    return DataParallelPPOActor(config=actor_config(ppo_mini_batch_size=4 // dp, ppo_micro_batch_size_per_gpu=2),
                                engine=engine)


def _my_rows(data: DataProto, engine) -> DataProto:
    from megatron.core import parallel_state as ps

    return data.chunk(engine.dp_size)[ps.get_data_parallel_rank()] if engine.dp_size > 1 else data


def _first_run(rank, world, model_dir, ckpt, out, tp, pp):
    engine = _engine(model_dir, tp, pp)
    actor = _actor(engine)
    actor.update_policy(_my_rows(_batch(1), engine))
    engine.save_checkpoint(ckpt, global_step=1)
    data = _batch(0)
    data.meta_info.update(micro_batch_size=2)
    log_probs, _ = actor.compute_log_prob(data)
    actor.update_policy(_my_rows(_batch(2), engine))
    weights = dict(engine.iter_full_params())
    if rank == 0:
        torch.save(weights, os.path.join(out, "first.pt"))
    if engine.is_output_rank:
        torch.save(log_probs, os.path.join(out, "log_probs_at_ckpt.pt"))


def _resumed_run(rank, world, model_dir, ckpt, out):
    engine = _engine(model_dir, 1, 1)
    engine.load_checkpoint(ckpt)
    _actor(engine).update_policy(_my_rows(_batch(2), engine))
    weights = dict(engine.iter_full_params())
    if rank == 0:
        torch.save(weights, os.path.join(out, "resumed.pt"))


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2_to_tp1", "pp2_to_pp1"])
def test_resume_on_another_layout_and_merge(tmp_path, tp, pp):
    model_dir = make_model_dir(str(tmp_path / "model"), seed=0, tie=True)
    ckpt, out = str(tmp_path / "global_step_1" / "actor"), str(tmp_path / "out")
    os.makedirs(out)
    run_distributed(_first_run, 2, model_dir, ckpt, out, tp, pp, err_dir=str(tmp_path))
    assert os.path.isdir(os.path.join(ckpt, "dist_ckpt"))
    run_distributed(_resumed_run, 2, model_dir, ckpt, out, err_dir=str(tmp_path))
    first, resumed = torch.load(os.path.join(out, "first.pt")), torch.load(os.path.join(out, "resumed.pt"))
    assert first.keys() == resumed.keys()
    for name in first:
        assert (first[name] - resumed[name]).abs().max() < TOL, name

    # the merger: an HF model with the checkpoint's weights gives the engine's log-probs at that step
    target = str(tmp_path / "merged")
    proc = subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "megatron",
                           "--local_dir", ckpt, "--target_dir", target], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO, HF_HUB_OFFLINE="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from transformers import AutoModelForCausalLM

    from verl.workers.engine.hf_forward import forward_log_probs

    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    batch = make_batch(bsz=4, prompt_len=6, resp_len=5, seed=0, with_ref=False)
    _, hf_lp = forward_log_probs(hf, batch)
    engine_lp = torch.load(os.path.join(out, "log_probs_at_ckpt.pt"))
    mask = batch["response_mask"].bool()
    assert (hf_lp - engine_lp)[mask].abs().max() < TOL


def test_merger_refuses_a_non_megatron_folder(tmp_path):
    (tmp_path / "huggingface").mkdir()
    make_model_dir(str(tmp_path / "huggingface"))
    proc = subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "megatron",
                           "--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), timeout=300)
    assert proc.returncode == 2
    assert "dist_ckpt" in proc.stderr
    assert not (tmp_path / "out").exists()
