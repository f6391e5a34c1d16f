"""LoRA on the experts of mixture-of-experts models (Megatron engine, ``actor_rollout_ref.model.lora.*``, fp32 on
gloo), with the tiny random Qwen3-MoE / Qwen2-MoE of ``test_megatron_moe`` (4 experts, top-2; Qwen2-MoE adds a gated
shared expert).

- one process, Qwen2-MoE, verl's Qwen3-MoE LoRA example keys (rank 32, alpha 64, kaiming A, default targets: every
  routed expert's and the shared expert's ``linear_fc1`` / ``linear_fc2`` besides attention): at step 0 the logits
  equal the base model's bit for bit; after two PPO updates only adapter parameters moved (router frozen), every
  expert adapter got a non-zero gradient, the reference (adapters off) is the base model, and the exported HF
  weights are ``W + alpha / rank * B @ A`` by hand in float64 for every expert and the shared expert; a checkpoint
  restores the adapters and the model merger writes the merged weights;
- expert parallel (Qwen3-MoE): EP=2 over two processes equals one process (B initialised non-zero so the first
  step reaches every matrix), and its export carries the merged experts of both expert-parallel ranks, checked by
  hand against the adapters each rank holds;
- tensor and expert tensor parallel (Qwen2-MoE): TP=2 with EP=1 / ETP=1, EP=2 / ETP=1 and ETP=2 (each expert's
  adapters cut as its weights) each equal one process, and the ETP=2 checkpoint, read back by the one-process
  model merger, gives the same merged weights;
- config: the example's keys on a Qwen3-MoE are accepted by ``main_ppo --check-config``; what is not built is
  refused by name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
sys.path.insert(0, os.path.dirname(__file__))
from engine_testlib import actor_config, assert_adapter_checkpoint_round_trip, run_distributed  # noqa: E402
from test_megatron_moe import BSZ, TOL, _batch, _mask, make_moe_dir  # noqa: E402

from tests.trainer.validator_assets import run_check_config  # noqa: E402
from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config  # noqa: E402
from verl.workers.engine.config import EngineConfig  # noqa: E402

pytest.importorskip("megatron.core")

REPO = Path(__file__).resolve().parents[3]
LR = 1e-3
# verl's examples/grpo_trainer/run_qwen3moe-30b_megatron_lora.sh (default target_modules)
EXAMPLE = {"rank": 32, "alpha": 64, "lora_A_init_method": "kaiming"}
# non-zero B so that the first step's gradient reaches A (and a layout's A-gradient reduction is exercised)
PARITY = {"rank": 4, "alpha": 8.0, "lora_A_init_method": "kaiming", "lora_B_init_method": "kaiming"}
EXPERTS, LAYERS = 4, 2


def _engine(model_dir, megatron=None, lora=None, trainable=True):
    from verl.workers.engine import get_engine_cls

    cfg = actor_config(optim={"lr": LR})
    engine_cfg = EngineConfig(model_path=model_dir, name="actor", strategy="megatron", megatron=dict(megatron or {}),
                              optim=typed_actor_config(cfg).optim if trainable else None, grad_clip=1.0,
                              total_training_steps=10, lora=dict(lora or {}))
    engine = get_engine_cls("megatron").build(engine_cfg)
    return engine, DataParallelPPOActor(config=cfg, engine=engine)


def _log_probs(actor) -> torch.Tensor:
    data = _batch(slice(0, BSZ))
    data.meta_info.update(micro_batch_size=2, temperature=1.0)
    return actor.compute_log_prob(data, calculate_entropy=False)[0]


def _logits(engine) -> torch.Tensor:
    """The model's logits on the batch's token rows (megatron's GPTModel called directly; causal mask, True =
    masked)."""
    ids = _batch(slice(0, BSZ)).batch["input_ids"]
    width = ids.shape[1]
    causal = torch.triu(torch.ones(width, width, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad():
        return engine.module(input_ids=ids, position_ids=torch.arange(width).expand(ids.shape[0], -1),
                             attention_mask=causal)


def _hf_base(model_dir) -> dict:
    from safetensors.torch import load_file

    return {k: v.double() for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()}


def _global_adapters(engine) -> dict:
    """This rank's adapter matrices (float64) by the weight they adapt, routed experts under their global index."""
    from megatron.core import parallel_state as ps

    per_rank = EXPERTS // ps.get_expert_model_parallel_world_size()
    first = ps.get_expert_model_parallel_rank() * per_rank
    out = {}
    for name, p in engine.module.named_parameters():
        if ".adapter.lora_" not in name:
            continue
        parts = name.split(".")
        if "local_experts" in parts:
            i = parts.index("local_experts") + 1
            parts[i] = str(first + int(parts[i]))
        out[".".join(parts)] = p.detach().double().clone()
    return out


def _expected_merged(base: dict, adapters: dict, scale: float, shared: bool) -> dict:
    """HF name -> ``W + scale * B @ A`` (float64) of every adapted MLP weight (routed experts, shared expert)."""

    def merge(w, pre):
        return w + scale * adapters[f"{pre}.adapter.lora_B"] @ adapters[f"{pre}.adapter.lora_A"]

    want = {}
    for layer in range(LAYERS):
        hf, mc = f"model.layers.{layer}.mlp", f"decoder.layers.{layer}.mlp"
        groups = [(f"{hf}.experts.{e}", f"{mc}.experts.local_experts.{e}") for e in range(EXPERTS)]
        if shared:
            groups.append((f"{hf}.shared_expert", f"{mc}.shared_experts"))
        for hf_pre, mc_pre in groups:
            gate, up = base[f"{hf_pre}.gate_proj.weight"], base[f"{hf_pre}.up_proj.weight"]
            fc1 = merge(torch.cat([gate, up]), f"{mc_pre}.linear_fc1")
            want[f"{hf_pre}.gate_proj.weight"] = fc1[: gate.shape[0]]
            want[f"{hf_pre}.up_proj.weight"] = fc1[gate.shape[0]:]
            want[f"{hf_pre}.down_proj.weight"] = merge(base[f"{hf_pre}.down_proj.weight"], f"{mc_pre}.linear_fc2")
    return want


def _worst(exported: dict, want: dict) -> float:
    assert set(want) <= set(exported), sorted(set(want) - set(exported))[:4]
    return max((exported[k].double() - v).abs().max().item() for k, v in want.items())


# ------------------------------------------------------------------------------------------------ one process

def _single_process(rank, world, model_dir, out_dir):
    base, base_actor = _engine(model_dir, trainable=False)
    engine, actor = _engine(model_dir, lora=EXAMPLE)
    assert torch.equal(_logits(engine), _logits(base))  # B = 0: the adapted MoE model is the base model
    base_lp = _log_probs(base_actor)
    mask = _mask()

    trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    assert trainable and all(".adapter.lora_" in n for n in trainable)
    # per layer: qkv, proj, the shared expert's fc1 / fc2 and the 4 routed experts' fc1 / fc2; A and B each
    assert len(trainable) == LAYERS * (2 + 2 + 2 * EXPERTS) * 2
    expert_adapters = {n for n in trainable if ".local_experts." in n}
    assert len(expert_adapters) == LAYERS * EXPERTS * 2 * 2
    assert {n for n in trainable if ".shared_experts." in n}
    assert not any("router" in n for n in trainable)
    opt_params = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for p in engine.module.parameters() if p.requires_grad}

    grads: dict = {}
    params = dict(engine.module.named_parameters())
    for name in trainable:
        params[name].register_hook(lambda g, n=name: grads.__setitem__(n, max(grads.get(n, 0.0), g.abs().max().item())))
    before = {n: p.detach().clone() for n, p in params.items()}
    data = _batch(slice(0, BSZ))
    for _ in range(2):
        actor.update_policy(data)
    zero = sorted(n for n in expert_adapters if grads.get(n, 0.0) == 0.0)
    assert not zero, f"expert adapters without gradient: {zero[:4]}"
    for name, value in before.items():
        moved = not torch.equal(value, params[name].detach())
        assert moved == (name in trainable), name  # every adapter matrix moved, no base weight (router included)

    lora_lp = _log_probs(actor)
    assert (lora_lp - base_lp)[mask].abs().max() > 1e-4  # the adapters changed the policy
    with engine.disable_adapter():  # the reference policy: adapters off
        assert (_log_probs(actor) - base_lp)[mask].abs().max() < 1e-6
        assert torch.equal(_logits(engine), _logits(base))
    assert torch.equal(_log_probs(actor), lora_lp)  # and back on after the block

    # the export: merged experts (and shared expert) by hand in float64; router and shared gate as they were
    exported = dict(engine.iter_full_params())
    hf = _hf_base(model_dir)
    adapters = _global_adapters(engine)
    want = _expected_merged(hf, adapters, EXAMPLE["alpha"] / EXAMPLE["rank"], shared=True)
    assert _worst(exported, want) < 1e-6
    for layer in range(LAYERS):
        for k in (f"model.layers.{layer}.mlp.gate.weight", f"model.layers.{layer}.mlp.shared_expert_gate.weight"):
            assert torch.equal(exported[k].double(), hf[k]), k
        k = f"model.layers.{layer}.mlp.experts.3.down_proj.weight"
        assert (exported[k].double() - hf[k]).abs().max() > 1e-5  # the merge is not the base weight

    # adapter dropout on the experts (ETP=1): drawn from megatron's expert-parallel generator, and training still
    # reaches every expert adapter
    from megatron.core.tensor_parallel import get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name

    drop, drop_actor = _engine(model_dir, lora=dict(EXAMPLE, lora_B_init_method="kaiming", dropout=0.3))
    tracker, name = get_cuda_rng_tracker(), get_expert_parallel_rng_tracker_name()
    state = tracker.get_states()[name].clone()
    drop_grads: dict = {}
    for n, p in drop.module.named_parameters():
        if ".local_experts." in n and p.requires_grad:
            p.register_hook(lambda g, n=n: drop_grads.__setitem__(n, max(drop_grads.get(n, 0.0), g.abs().max().item())))
    drop_actor.update_policy(data)
    assert not torch.equal(tracker.get_states()[name], state)
    assert len(drop_grads) == len(expert_adapters) and min(drop_grads.values()) > 0

    # checkpoint: a fresh LoRA engine (other initial adapters) restores this one's adapters and policy
    assert_adapter_checkpoint_round_trip(
        engine, lambda: _engine(model_dir, lora=dict(EXAMPLE, lora_B_init_method="kaiming")), _log_probs, out_dir,
        params, lora_lp[mask], mask, exported)

def test_expert_lora_starts_as_base_trains_adapters_only_and_exports_merged(tmp_path):
    model_dir = make_moe_dir(str(tmp_path / "model"), "qwen2_moe")
    run_distributed(_single_process, 1, model_dir, str(tmp_path), err_dir=str(tmp_path))


# ------------------------------------------------------------------------------------------ parallel layouts

def _parity_rank(rank, world, model_dir, out_dir, megatron, tag, save_ckpt):
    engine, actor = _engine(model_dir, megatron=megatron, lora=PARITY)
    log_probs = _log_probs(actor)
    metrics = actor.update_policy(_batch(slice(0, BSZ)))
    after = _log_probs(actor)
    weights = dict(engine.iter_full_params())
    torch.save(_global_adapters(engine), os.path.join(out_dir, f"{tag}_adapters{rank}.pt"))
    if save_ckpt:
        engine.save_checkpoint(os.path.join(out_dir, f"{tag}_ckpt"), global_step=1)
    if engine.is_output_rank and rank == 0:
        torch.save({"log_probs": log_probs, "after": after, "grad_norm": metrics["actor/grad_norm"],
                    "weights": weights}, os.path.join(out_dir, f"{tag}.pt"))


def _layout_run(tmp_path, model_dir, tag, world, megatron, save_ckpt=False) -> dict:
    run_distributed(_parity_rank, world, model_dir, str(tmp_path), megatron, tag, save_ckpt, err_dir=str(tmp_path))
    out = torch.load(tmp_path / f"{tag}.pt")
    out["adapters"] = [torch.load(tmp_path / f"{tag}_adapters{r}.pt") for r in range(world)]
    return out


def _assert_same_step(got: dict, ref: dict) -> None:
    mask = _mask()
    assert (got["log_probs"] - ref["log_probs"])[mask].abs().max() < TOL
    assert (got["after"] - ref["after"])[mask].abs().max() < TOL
    assert (ref["after"] - ref["log_probs"])[mask].abs().max() > 1e-4  # the step moved the policy
    assert torch.as_tensor(got["grad_norm"]).double().numpy() == pytest.approx(
        torch.as_tensor(ref["grad_norm"]).double().numpy(), rel=1e-5)
    assert got["weights"].keys() == ref["weights"].keys()
    for name, tensor in ref["weights"].items():
        assert (got["weights"][name] - tensor).abs().max().item() < TOL, name


def test_expert_lora_ep2_matches_one_process_and_exports_both_ranks_experts(tmp_path):
    model_dir = make_moe_dir(str(tmp_path / "model"), "qwen3_moe")
    one = _layout_run(tmp_path, model_dir, "one", 1, {})
    ep2 = _layout_run(tmp_path, model_dir, "ep2", 2, {"expert_model_parallel_size": 2})
    _assert_same_step(ep2, one)
    # each expert-parallel rank holds adapters for its own two experts only
    held = [{n.split("local_experts.")[1].split(".")[0] for n in a if "local_experts." in n} for a in ep2["adapters"]]
    assert held == [{"0", "1"}, {"2", "3"}], held
    adapters = {**ep2["adapters"][0], **ep2["adapters"][1]}
    want = _expected_merged(_hf_base(model_dir), adapters, PARITY["alpha"] / PARITY["rank"], shared=False)
    assert _worst(ep2["weights"], want) < 1e-6


def _merge(rank, world, ckpt, hf_config_dir, out_path):
    from transformers import AutoConfig

    from verl.model_merger.megatron_model_merger import load_megatron_checkpoint

    torch.save(load_megatron_checkpoint(ckpt, AutoConfig.from_pretrained(hf_config_dir), value_head=False), out_path)


def test_expert_lora_tp2_layouts_match_one_process_and_the_etp2_checkpoint_merges_at_one(tmp_path):
    model_dir = make_moe_dir(str(tmp_path / "model"), "qwen2_moe")
    one = _layout_run(tmp_path, model_dir, "one", 1, {})
    # TP=2 (sequence parallel; the shared expert's adapters cut over the tensor ranks) with: every expert on both
    # ranks, whole (EP=1, ETP=1); experts split over the ranks (EP=2, ETP=1); every expert cut in two (ETP=2)
    runs = {}
    for ep, etp in ((1, 1), (2, 1), (1, 2)):
        tag = f"tp2ep{ep}etp{etp}"
        runs[tag] = _layout_run(tmp_path, model_dir, tag, 2, {"tensor_model_parallel_size": 2,
                                                              "expert_model_parallel_size": ep,
                                                              "expert_tensor_parallel_size": etp,
                                                              "sequence_parallel": True}, save_ckpt=etp == 2)
        _assert_same_step(runs[tag], one)
    etp2 = runs["tp2ep1etp2"]
    # each expert tensor rank holds half of every expert's fc1 B rows and fc2 A columns
    fc1_b = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.adapter.lora_B"
    assert etp2["adapters"][0][fc1_b].shape[0] * 2 == one["adapters"][0][fc1_b].shape[0]
    # the one-process model merger reads the TP=2 / ETP=2 checkpoint (gate / up rows of fc1's B as the weight's)
    out = tmp_path / "merged.pt"
    run_distributed(_merge, 1, str(tmp_path / "tp2ep1etp2_ckpt"), model_dir, str(out), err_dir=str(tmp_path))
    merged = torch.load(out)
    assert set(merged) == set(etp2["weights"])
    for name, tensor in etp2["weights"].items():
        assert torch.allclose(merged[name], tensor, atol=1e-6, rtol=0), name


# ------------------------------------------------------------------------------------------------------ config

def _check_config(tmp_path, assets, *extra):
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    args = ["--config-name=ppo_megatron_trainer", f"data.train_files={assets / 'train.parquet'}",
            f"data.val_files={assets / 'train.parquet'}", f"actor_rollout_ref.model.path={assets / 'model'}",
            "actor_rollout_ref.rollout.name=hf", "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
            "trainer.n_gpus_per_node=2", *extra]
    return run_check_config(run_dir, args)


def test_example_keys_accepted_on_a_qwen3_moe_and_unbuilt_combinations_refused(tmp_path):
    from transformers import AutoConfig

    from tests.trainer.validator_assets import add_tokenizer_file, write_rl_parquet
    from verl.models.mcore.lora import check_lora_settings

    assets = tmp_path / "assets"
    assets.mkdir()
    write_rl_parquet(assets / "train.parquet")
    make_moe_dir(str(assets / "model"), "qwen3_moe")
    add_tokenizer_file(assets / "model")
    lora = [f"actor_rollout_ref.model.lora.{k}={v}" for k, v in EXAMPLE.items()]
    layout = ["actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
              "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1"]
    rc, out = _check_config(tmp_path, assets, *lora, *layout)
    assert rc == 0 and out.rstrip().endswith("config ok"), out[-3000:]
    # dropout on the experts' adapters needs ETP=1: refused before any worker starts, naming both keys
    rc, out = _check_config(tmp_path, assets, *lora, "actor_rollout_ref.model.lora.dropout=0.05",
                            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                            "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=2")
    assert rc == 2 and "actor_rollout_ref.model.lora.dropout=0.05 with megatron.expert_tensor_parallel_size=2" in out, \
        out[-3000:]

    hf = AutoConfig.from_pretrained(str(assets / "model"))
    tp2 = {"tensor_model_parallel_size": 2}  # ETP follows TP
    s = check_lora_settings(dict(EXAMPLE, dropout=0.05), hf, "m.lora", megatron={"expert_tensor_parallel_size": 1})
    assert s is not None and s.dropout == 0.05  # ETP=1: expert dropout is built
    # ETP > 1 without the experts adapted: nothing to refuse
    assert check_lora_settings(dict(EXAMPLE, dropout=0.05, target_modules=[], exclude_modules=["*.experts.*"]), hf,
                               "m.lora", megatron=tp2) is not None
    for cfg, words in [
        (dict(EXAMPLE, dropout=0.05), "m.lora.dropout=0.05 with megatron.expert_tensor_parallel_size=2"),
        (dict(EXAMPLE, target_modules=["linear_qkv", "router"]), "m.lora.target_modules names 'router': the "
                                                                "mixture-of-experts router stays frozen"),
        (dict(EXAMPLE, type="canonical_lora"), "m.lora.type='canonical_lora' is not available"),
        (dict(EXAMPLE, target_modules=["linear_fc1_gate"]), "m.lora.target_modules names 'linear_fc1_gate', a "
                                                            "canonical-LoRA layer"),
    ]:
        with pytest.raises(ValueError, match=None) as err:
            check_lora_settings(cfg, hf, "m.lora", megatron=tp2)
        assert words in str(err.value), str(err.value)
