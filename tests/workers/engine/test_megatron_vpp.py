"""Virtual pipeline stages (megatron's interleaved layer assignment) on CPU (gloo).

A 4-layer tiny Qwen2 (tied embeddings) on PP=2 x VPP=2 (two processes, two model chunks each: rank 0 holds
layers 0 and 2, rank 1 layers 1 and 3) against the same model on one process (PP=1): log-probs, entropies, the
PPO step's gradient norm and the updated weights (exported under HF names) must agree within 1e-5. The VPP run
saves a checkpoint after the first step; the PP=1 run loads it and takes the second step, which must give the VPP
run's second step (the checkpoint holds every chunk's layers and Adam moments under global names), and the VPP run
reloads its own checkpoint and repeats the second step exactly. Its tensor-parallel shard stream (the rollout
weight push) equals the gathered export.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import VOCAB, actor_config, make_batch, run_distributed, tiny_model  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config  # noqa: E402
from verl.workers.engine.config import EngineConfig  # noqa: E402

pytest.importorskip("megatron.core")

TOL = 1e-5
LR = 1e-3  # see test_megatron_parity.py: keeps Adam's sign-like first step below TOL on rarely used rows


def _batch(seed: int) -> DataProto:
    return DataProto.from_dict(make_batch(bsz=4, prompt_len=6, resp_len=5, seed=seed, with_ref=False))


def _engine_and_actor(model_dir, pp, vpp):
    from verl.workers.engine import get_engine_cls

    cfg = actor_config(optim={"lr": LR}, entropy_coeff=0.01)
    engine_cfg = EngineConfig(model_path=model_dir, name="actor", strategy="megatron",
                              megatron={"pipeline_model_parallel_size": pp,
                                        "virtual_pipeline_model_parallel_size": vpp},
                              optim=typed_actor_config(cfg).optim, grad_clip=1.0, total_training_steps=10)
    engine = get_engine_cls("megatron").build(engine_cfg)
    return engine, DataParallelPPOActor(config=cfg, engine=engine)


def _log_probs(actor):
    data = _batch(0)
    data.meta_info.update(micro_batch_size=2, temperature=1.0)
    return actor.compute_log_prob(data, calculate_entropy=True)


def _vpp_run(rank, world, model_dir, ckpt, out_dir):
    engine, actor = _engine_and_actor(model_dir, 2, 2)
    assert len(engine.chunks) == 2
    layers = {v: sorted(int(n.split(".")[2]) for n, _ in c.named_parameters() if n.startswith("decoder.layers.")
                        and n.endswith("input_layernorm.weight")) for v, c in enumerate(engine.chunks)}
    offsets = [engine.chunks[v].decoder.layers[0].layer_number - 1 for v in range(2)]  # megatron's global numbers
    log_probs, entropy = _log_probs(actor)
    metrics = actor.update_policy(_batch(1))
    first = _weights(engine.iter_full_params())
    engine.save_checkpoint(ckpt, global_step=1)
    actor.update_policy(_batch(2))
    second = _weights(engine.iter_full_params())
    shards = _weights(engine.iter_tp_shards((0, VOCAB)))
    engine.load_checkpoint(ckpt)
    actor.update_policy(_batch(2))
    again = _weights(engine.iter_full_params())
    if engine.is_output_rank:
        torch.save({"log_probs": log_probs, "entropy": entropy, "metrics": metrics, "first": first, "second": second,
                    "shards": shards, "again": again}, os.path.join(out_dir, "vpp.pt"))
    torch.save({"layers": layers, "offsets": offsets}, os.path.join(out_dir, f"layout{rank}.pt"))


def _reference_run(rank, world, model_dir, ckpt, out_dir):
    engine, actor = _engine_and_actor(model_dir, 1, None)
    log_probs, entropy = _log_probs(actor)
    metrics = actor.update_policy(_batch(1))
    first = _weights(engine.iter_full_params())
    engine.load_checkpoint(ckpt)  # the VPP run's step-1 checkpoint
    actor.update_policy(_batch(2))
    second = _weights(engine.iter_full_params())
    torch.save({"log_probs": log_probs, "entropy": entropy, "metrics": metrics, "first": first, "second": second},
               os.path.join(out_dir, "ref.pt"))


def _weights(stream) -> dict:
    return {k: v.clone() for k, v in stream}  # a stage's own replicated tensors are views of live parameters


def _close(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for name in a:
        diff = (a[name] - b[name]).abs().max().item()
        assert diff < TOL, f"{what} {name}: {diff}"


def test_vpp_matches_single_stage(tmp_path):
    model_dir = str(tmp_path / "model")
    tiny_model(seed=0, tie=True, layers=4).save_pretrained(model_dir)
    ckpt, out = str(tmp_path / "global_step_1" / "actor"), tmp_path / "out"
    out.mkdir()
    run_distributed(_vpp_run, 2, model_dir, ckpt, str(out), err_dir=str(tmp_path))
    run_distributed(_reference_run, 1, model_dir, ckpt, str(out), err_dir=str(tmp_path))
    got, ref = torch.load(out / "vpp.pt"), torch.load(out / "ref.pt")

    # megatron's interleaved assignment: chunk v of rank r holds virtual stage v * pp + r
    for rank, offsets in ((0, [0, 2]), (1, [1, 3])):
        layout = torch.load(out / f"layout{rank}.pt")
        assert layout["offsets"] == offsets
        assert layout["layers"] == {0: [0], 1: [0]}  # one layer per chunk, local index 0

    mask = make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False)["response_mask"].bool()
    assert (got["log_probs"] - ref["log_probs"])[mask].abs().max() < TOL
    assert (got["entropy"] - ref["entropy"])[mask].abs().max() < TOL
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5, abs=1e-7), key
    _close(got["first"], ref["first"], "after step 1:")
    _close(got["second"], ref["second"], "step 2 from the VPP checkpoint:")
    _close(got["again"], got["second"], "step 2 after reloading the VPP checkpoint:")
    shards = {k: v for k, v in got["second"].items() if k != "lm_head.weight"}  # tied: the engine shares it
    _close(got["shards"], shards, "tensor-parallel shard stream:")
    from safetensors.torch import load_file

    before = load_file(os.path.join(model_dir, "model.safetensors"))
    assert max((got["first"][k] - before[k]).abs().max().item() for k in before) > 1e-4  # the step moved weights


def test_vpp_sizes_are_checked():
    from verl.models.mcore.settings import check_megatron_settings
    from engine_testlib import tiny_config

    cfg = tiny_config(layers=4)
    with pytest.raises(ValueError, match=r"actor\.megatron\.virtual_pipeline_model_parallel_size=4.*use one of"):
        check_megatron_settings({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 4}, cfg,
                                "actor.megatron")
    with pytest.raises(ValueError, match=r"needs actor\.megatron\.pipeline_model_parallel_size > 1"):
        check_megatron_settings({"virtual_pipeline_model_parallel_size": 2}, cfg, "actor.megatron")
    check_megatron_settings({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}, cfg,
                            "actor.megatron")
