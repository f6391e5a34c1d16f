"""Mixture-of-experts models on the Megatron engine (fp32, gloo): a tiny random Qwen3-MoE (4 experts, top-2, query /
key norms) and Qwen2-MoE (plus a gated shared expert).

- against Hugging Face: the engine's log-probs, entropies, gradient norm and weights after one PPO step equal the
  FSDP engine's on the HF model (within 1e-5, as ``test_megatron_parity``), and the weights exported under HF names
  before the step are the checkpoint's, bit for bit;
- expert parallel: EP=2 over two processes (each its own half of the batch, tokens sent to the other rank's experts
  by all-to-all) equals EP=1 on the same two processes (log-probs, entropies and gradient norms
  within 1e-6, weights after the step within 1e-5), and TP=2 with EP=2 / ETP=1, EP=1 / ETP=1 and EP=1 / ETP=2
  equals the single-process run (1e-5);
- activation recomputation on CPU (``recompute_granularity`` full uniform / block: bit-identical step; selective:
  within 1e-6);
- the config checks: expert parallel on a dense model, or a size that does not split the experts, is refused
  naming the key.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import VOCAB, actor_config, make_batch, run_distributed, tiny_config  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.utils.hf_experts import unfuse_expert_weights  # noqa: E402
from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config  # noqa: E402
from verl.workers.engine import FSDPEngine  # noqa: E402
from verl.workers.engine.config import EngineConfig, actor_engine_config  # noqa: E402

pytest.importorskip("megatron.core")

TOL = 1e-5
EP_TOL = 1e-6  # expert parallel vs none on the same processes: log-probs, entropies, gradient norms
LR = 1e-3  # see test_megatron_parity: keeps Adam's first-step rounding below TOL
BSZ = 8


def moe_config(kind: str = "qwen3_moe"):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                  num_experts_per_tok=2, max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6,
                  decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2)
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(head_dim=16, norm_topk_prob=True, **common)
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(shared_expert_intermediate_size=48, norm_topk_prob=False, qkv_bias=True, **common)


def make_moe_dir(path: str, kind: str = "qwen3_moe", seed: int = 0) -> str:
    """A tiny random MoE model directory; its norms are perturbed so that each one's weight matters."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(moe_config(kind)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(path)
    return path


def _rows(rank: int, dp: int, split: bool) -> slice:
    """The batch rows a data-parallel rank trains on (all of them when not ``split``)."""
    if not split:
        return slice(0, BSZ)
    per = BSZ // dp
    return slice(rank * per, (rank + 1) * per)


def _batch(rows: slice) -> DataProto:
    full = make_batch(bsz=BSZ, prompt_len=6, resp_len=5, with_ref=False)
    return DataProto.from_dict({k: v[rows] for k, v in full.items()})


def _megatron_rank(rank, world, model_dir, out_dir, megatron, split):
    from verl.workers.engine import get_engine_cls

    cfg = actor_config(optim={"lr": LR}, entropy_coeff=0.01)
    engine_cfg = EngineConfig(model_path=model_dir, name="actor", strategy="megatron", megatron=dict(megatron),
                              optim=typed_actor_config(cfg).optim, grad_clip=1.0, total_training_steps=10)
    engine = get_engine_cls("megatron").build(engine_cfg)
    exported = {k: v.clone() for k, v in engine.iter_full_params()}  # views of the parameters at TP=1
    actor = DataParallelPPOActor(config=cfg, engine=engine)
    rows = _rows(*_dp_rank_and_size(), split)
    data = _batch(rows)
    data.meta_info.update(micro_batch_size=2, temperature=1.0)
    log_probs, entropy = actor.compute_log_prob(data, calculate_entropy=True)
    metrics = actor.update_policy(_batch(rows))
    weights = dict(engine.iter_full_params())
    if engine.is_output_rank:
        torch.save({"log_probs": log_probs, "entropy": entropy, "metrics": metrics, "weights": weights,
                    "exported": exported, "rows": (rows.start, rows.stop)},
                   os.path.join(out_dir, f"rank{rank}.pt"))


def _dp_rank_and_size() -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()


def _run(tmp_path, name, model_dir, world, megatron, split=False) -> dict:
    """The engine's outputs, rows of every data-parallel rank concatenated in order."""
    out_dir = tmp_path / name
    out_dir.mkdir()
    run_distributed(_megatron_rank, world, model_dir, str(out_dir), megatron, split, err_dir=str(tmp_path))
    got = sorted((torch.load(f) for f in out_dir.iterdir()), key=lambda r: r["rows"])
    merged = dict(got[0])
    merged["log_probs"] = torch.cat([g["log_probs"] for g in got])
    merged["entropy"] = torch.cat([g["entropy"] for g in got])
    merged["grad_norms"] = [float(n) for g in got for n in torch.as_tensor(g["metrics"]["actor/grad_norm"]).flatten()]
    return merged


def _fsdp_reference(model_dir) -> dict:
    from transformers import AutoModelForCausalLM

    from verl.utils.fsdp_utils import build_lr_scheduler, build_optimizer

    cfg = actor_config(optim={"lr": LR}, entropy_coeff=0.01)
    module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine_cfg = actor_engine_config({"model": {"path": model_dir}, "actor": cfg})
    optimizer = build_optimizer(module.parameters(), engine_cfg.optim)
    engine = FSDPEngine(module, optimizer, build_lr_scheduler(optimizer, engine_cfg.optim, 10), grad_clip=1.0)
    actor = DataParallelPPOActor(config=cfg, engine=engine)
    data = _batch(slice(0, BSZ))
    data.meta_info.update(micro_batch_size=2, temperature=1.0)
    log_probs, entropy = actor.compute_log_prob(data, calculate_entropy=True)
    metrics = actor.update_policy(_batch(slice(0, BSZ)))
    return {"log_probs": log_probs, "entropy": entropy, "metrics": metrics,
            "weights": dict(unfuse_expert_weights(engine.iter_full_params()))}


def _mask() -> torch.Tensor:
    return make_batch(bsz=BSZ, prompt_len=6, resp_len=5, with_ref=False)["response_mask"].bool()


def _assert_close(got: dict, ref: dict, tol: float, weight_tol: float = TOL) -> None:
    """Outputs within ``tol``; weights after the step within ``weight_tol`` (Adam's first step is about
    lr * sign(grad), so gradients near Adam's eps that differ in their last bits move weights by up to ~lr: see
    test_megatron_parity)."""
    mask = _mask()
    assert (got["log_probs"] - ref["log_probs"])[mask].abs().max() < tol
    assert (got["entropy"] - ref["entropy"])[mask].abs().max() < tol
    assert set(got["weights"]) == set(ref["weights"])
    for name, tensor in ref["weights"].items():
        diff = (got["weights"][name] - tensor).abs().max().item()
        assert diff < weight_tol, f"{name}: {diff}"


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_moe_matches_hf(tmp_path, kind):
    from safetensors.torch import load_file

    model_dir = make_moe_dir(str(tmp_path / "model"), kind)
    got = _run(tmp_path, "mcore", model_dir, 1, {"use_mbridge": True})
    ref = _fsdp_reference(model_dir)
    before = load_file(os.path.join(model_dir, "model.safetensors"))
    assert set(got["exported"]) == set(before)  # per-expert HF names, as the checkpoint and vLLM name them
    for name, tensor in before.items():
        assert torch.equal(got["exported"][name], tensor), name
    _assert_close(got, ref, TOL)
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(ref["metrics"]["actor/grad_norm"], rel=1e-5)
    moved = max((got["weights"][k] - before[k]).abs().max().item() for k in before if ".experts." in k)
    assert moved > 1e-4  # the experts were trained (a no-op update would also 'match')


def test_expert_parallel_matches_ep1(tmp_path):
    model_dir = make_moe_dir(str(tmp_path / "model"))
    ep1 = _run(tmp_path, "ep1", model_dir, 2, {}, split=True)
    ep2 = _run(tmp_path, "ep2", model_dir, 2, {"expert_model_parallel_size": 2}, split=True)
    _assert_close(ep2, ep1, EP_TOL)
    assert ep2["grad_norms"] == pytest.approx(ep1["grad_norms"], rel=1e-6)
    assert ep2["grad_norms"][0] == pytest.approx(ep2["grad_norms"][1], rel=1e-12)  # one norm for the whole model


def test_tensor_and_expert_parallel_match_one_process(tmp_path):
    model_dir = make_moe_dir(str(tmp_path / "model"))
    one = _run(tmp_path, "one", model_dir, 1, {})
    # TP=2 with: experts split over the two ranks (EP=2, ETP=1); every expert on both ranks, whole (EP=1, ETP=1:
    # the ranks share the tokens, so expert gradients are summed over them); every expert cut in two (ETP=2)
    for ep, etp in ((2, 1), (1, 1), (1, 2)):
        both = _run(tmp_path, f"tp2ep{ep}etp{etp}", model_dir, 2,
                    {"tensor_model_parallel_size": 2, "expert_model_parallel_size": ep,
                     "expert_tensor_parallel_size": etp, "sequence_parallel": True})
        _assert_close(both, one, TOL)
        assert both["metrics"]["actor/grad_norm"] == pytest.approx(one["metrics"]["actor/grad_norm"], rel=1e-5)


def test_expert_parallel_refusals():
    from verl.models.mcore.settings import check_megatron_settings

    with pytest.raises(ValueError, match=r"actor\.megatron\.expert_model_parallel_size=2: the model "
                                         r"\(Qwen2ForCausalLM\) has no experts.*use expert_model_parallel_size=1"):
        dense = tiny_config()
        dense.architectures = ["Qwen2ForCausalLM"]
        check_megatron_settings({"expert_model_parallel_size": 2}, dense, "actor.megatron")
    moe = moe_config()
    moe.architectures = ["Qwen3MoeForCausalLM"]
    check_megatron_settings({"expert_model_parallel_size": 4}, moe, "actor.megatron")
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=3 must divide the model's 4 experts; use one "
                                         r"of \[1, 2, 4\]"):
        check_megatron_settings({"expert_model_parallel_size": 3}, moe, "actor.megatron")
    with pytest.raises(ValueError, match=r"sequence_parallel=False .* set sequence_parallel=True"):
        check_megatron_settings({"tensor_model_parallel_size": 2, "sequence_parallel": False}, moe, "actor.megatron")
    with pytest.raises(ValueError, match=r"moe_token_dispatcher_type='allgather' with expert_model_parallel_size=2.*"
                                         r"use moe_token_dispatcher_type=alltoall"):
        check_megatron_settings({"expert_model_parallel_size": 2, "override_transformer_config":
                                 {"moe_token_dispatcher_type": "allgather"}}, moe, "actor.megatron")


# activation recomputation (megatron's recompute_granularity) on CPU: full recomputation replays each layer's forward
# exactly, so the gradients (and the step) are bit-identical; selective recomputation of the norms and the MoE layer
# sums some gradients in another order (differences of ~1e-7 relative)
RECOMPUTE = [
    ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}, True),
    ({"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 1}, True),
    ({"recompute_granularity": "selective", "recompute_modules": ["core_attn", "layernorm", "moe"]}, False),
]


def test_recompute_gives_the_same_step(tmp_path):
    model_dir = make_moe_dir(str(tmp_path / "model"))
    plain = _run(tmp_path, "plain", model_dir, 2, {"tensor_model_parallel_size": 2})
    for i, (over, exact) in enumerate(RECOMPUTE):
        again = _run(tmp_path, f"recompute{i}", model_dir, 2, {"tensor_model_parallel_size": 2,
                                                               "override_transformer_config": over})
        if exact:
            assert again["grad_norms"] == plain["grad_norms"], over
            for name, tensor in plain["weights"].items():
                assert torch.equal(again["weights"][name], tensor), (over, name)
        else:
            assert again["grad_norms"] == pytest.approx(plain["grad_norms"], rel=1e-6), over
            _assert_close(again, plain, EP_TOL)
