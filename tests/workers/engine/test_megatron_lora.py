"""LoRA on the Megatron engine (``actor_rollout_ref.model.lora.*``), fp32 on gloo.

One process: at initialisation (B = 0) the LoRA model's log-probs equal the base model's; after two PPO steps only
adapter parameters moved and the reference (adapters disabled) still gives the base model's log-probs; the exported
HF weights are ``W + alpha / rank * B @ A`` computed by hand in float64; a checkpoint restores the adapters and the
model merger writes the merged weights. Two processes: a LoRA step at TP=2 (sequence parallel on) equals the same
step at TP=1 within the engine parity tolerance (B initialised non-zero so the first step reaches A, and the
gated ``linear_fc1`` adapter rows are cut as its weight is).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import (  # noqa: E402
    actor_config, assert_adapter_checkpoint_round_trip, make_batch, make_model_dir, run_distributed)

from verl.protocol import DataProto  # noqa: E402
from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config  # noqa: E402
from verl.workers.engine.config import EngineConfig  # noqa: E402

pytest.importorskip("megatron.core")

TOL = 1e-5  # as tests/workers/engine/test_megatron_parity.py
LR = 1e-3
RANK, ALPHA = 4, 8.0


def _batch() -> DataProto:
    return DataProto.from_dict(make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False))


def _engine(model_dir, tp=1, lora=None, trainable=True):
    from verl.workers.engine import get_engine_cls

    cfg = actor_config(optim={"lr": LR})
    engine_cfg = EngineConfig(model_path=model_dir, name="actor", strategy="megatron",
                              megatron={"tensor_model_parallel_size": tp, "sequence_parallel": True},
                              optim=typed_actor_config(cfg).optim if trainable else None, grad_clip=1.0,
                              total_training_steps=10, lora=dict(lora or {}))
    engine = get_engine_cls("megatron").build(engine_cfg)
    return engine, DataParallelPPOActor(config=cfg, engine=engine)


def _log_probs(actor) -> torch.Tensor:
    data = _batch()
    data.meta_info.update(micro_batch_size=2, temperature=1.0)
    return actor.compute_log_prob(data, calculate_entropy=False)[0]


def _single_process(rank, world, model_dir, out_dir):
    from verl.models.mcore.convert import unshard
    from verl.models.mcore.model import model_shapes

    base, base_actor = _engine(model_dir, trainable=False)
    lora_cfg = {"rank": RANK, "alpha": ALPHA}
    engine, actor = _engine(model_dir, lora=lora_cfg)
    base_lp = _log_probs(base_actor)
    mask = make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False)["response_mask"].bool()
    assert torch.equal(_log_probs(actor)[mask], base_lp[mask])  # B = 0: the LoRA model is the base model

    trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    assert trainable and all(".adapter.lora_" in n for n in trainable)
    assert len(trainable) == 2 * 4 * 2  # A and B of the four layer kinds, two layers
    opt_params = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for p in engine.module.parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    for _ in range(2):
        actor.update_policy(_batch())
    after = dict(engine.module.named_parameters())
    for name, value in before.items():
        moved = not torch.equal(value, after[name].detach())
        assert moved == (name in trainable), name  # every adapter matrix moved (A from the second step), no base weight

    lora_lp = _log_probs(actor)
    assert (lora_lp - base_lp)[mask].abs().max() > 1e-4  # the adapters changed the policy
    with engine.disable_adapter():  # the reference policy: adapters off
        ref_lp = _log_probs(actor)
    assert (ref_lp - base_lp)[mask].abs().max() < 1e-6
    assert torch.equal(_log_probs(actor), lora_lp)  # and back on after the block

    # exported weights: W + alpha / rank * B @ A by hand in float64
    exported = dict(engine.iter_full_params())
    params = {n: p.detach().double() for n, p in engine.module.named_parameters()}
    scale = ALPHA / RANK

    def merged(layer, kind):
        pre = f"decoder.layers.{layer}.{kind}"
        return params[f"{pre}.weight"] + scale * params[f"{pre}.adapter.lora_B"] @ params[f"{pre}.adapter.lora_A"]

    shapes = model_shapes(engine.hf_config, 1)
    worst = 0.0
    for layer in range(2):
        hf = f"model.layers.{layer}"
        fc1 = merged(layer, "mlp.linear_fc1")
        q, k, v = unshard("qkv", [merged(layer, "self_attention.linear_qkv")], shapes)
        want = {f"{hf}.self_attn.o_proj.weight": merged(layer, "self_attention.linear_proj"),
                f"{hf}.mlp.down_proj.weight": merged(layer, "mlp.linear_fc2"),
                f"{hf}.mlp.gate_proj.weight": fc1[: fc1.shape[0] // 2], f"{hf}.mlp.up_proj.weight": fc1[fc1.shape[0] // 2:],
                f"{hf}.self_attn.q_proj.weight": q, f"{hf}.self_attn.k_proj.weight": k,
                f"{hf}.self_attn.v_proj.weight": v}
        for name, tensor in want.items():
            worst = max(worst, (exported[name].double() - tensor).abs().max().item())
        assert (exported[f"{hf}.mlp.down_proj.weight"].double() - params[f"decoder.layers.{layer}.mlp.linear_fc2.weight"]
                ).abs().max() > 1e-5  # the merge is not the base weight
    assert worst < 1e-6, worst

    # checkpoint: a fresh LoRA engine (other initial adapters) restores this one's adapters and policy
    assert_adapter_checkpoint_round_trip(
        engine, lambda: _engine(model_dir, lora=dict(lora_cfg, lora_B_init_method="kaiming")), _log_probs, out_dir,
        after, lora_lp[mask], mask, exported)

def test_lora_starts_as_base_trains_adapters_only_and_exports_merged(tmp_path):
    model_dir = make_model_dir(str(tmp_path / "model"), seed=0, tie=False)
    run_distributed(_single_process, 1, model_dir, str(tmp_path), err_dir=str(tmp_path))


# non-zero B so the first step's gradient reaches A; dropout off (its masks differ between layouts)
PARITY_LORA = {"rank": RANK, "alpha": ALPHA, "lora_B_init_method": "kaiming", "lora_A_init_method": "kaiming"}


def _parity_rank(rank, world, model_dir, out_dir, tp):
    engine, actor = _engine(model_dir, tp=tp, lora=PARITY_LORA)
    log_probs = _log_probs(actor)
    metrics = actor.update_policy(_batch())
    after = _log_probs(actor)
    weights = dict(engine.iter_full_params())
    if engine.is_output_rank:
        torch.save({"log_probs": log_probs, "after": after, "grad_norm": metrics["actor/grad_norm"],
                    "weights": weights}, os.path.join(out_dir, f"tp{tp}.pt"))


def test_lora_step_tp2_matches_tp1(tmp_path):
    model_dir = make_model_dir(str(tmp_path / "model"), seed=0, tie=True)
    run_distributed(_parity_rank, 2, model_dir, str(tmp_path), 2, err_dir=str(tmp_path))
    run_distributed(_parity_rank, 1, model_dir, str(tmp_path), 1, err_dir=str(tmp_path))
    tp2, tp1 = torch.load(tmp_path / "tp2.pt"), torch.load(tmp_path / "tp1.pt")
    mask = make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False)["response_mask"].bool()
    assert (tp2["log_probs"] - tp1["log_probs"])[mask].abs().max() < TOL
    assert (tp2["after"] - tp1["after"])[mask].abs().max() < TOL
    assert tp2["grad_norm"] == pytest.approx(tp1["grad_norm"], rel=1e-5)
    assert tp2["weights"].keys() == tp1["weights"].keys()
    for name, tensor in tp1["weights"].items():
        assert (tp2["weights"][name] - tensor).abs().max().item() < TOL, name
    assert (tp1["after"] - tp1["log_probs"])[mask].abs().max() > 1e-4  # the step moved the policy
