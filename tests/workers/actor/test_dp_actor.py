"""DataParallelPPOActor: log-probs equal a plain HF forward (padded, packed, dynamic bsz); 2 FSDP2 ranks make the
same update as one process; bf16 runs; LoRA trains only adapters and streams merged base names."""

import copy
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from engine_testlib import actor_config, make_batch, run_distributed, tiny_model  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.utils.fsdp_utils import build_optimizer, get_full_state_dict  # noqa: E402
from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config  # noqa: E402

TEMP = 0.7


def hf_reference(model, b, temperature=TEMP):
    """log softmax(logits / T) gathered at the response tokens, one unpadded sequence at a time."""
    resp_len = b["responses"].shape[1]
    out_lp = torch.zeros(b["responses"].shape)
    out_ent = torch.zeros(b["responses"].shape)
    with torch.no_grad():
        for i in range(b["input_ids"].shape[0]):
            keep = b["attention_mask"][i].bool()
            ids = b["input_ids"][i][keep].unsqueeze(0)
            logits = model(input_ids=ids).logits[0] / temperature
            n_resp = int(b["response_mask"][i].sum())
            pred = logits[-n_resp - 1 : -1]  # positions predicting the valid response tokens
            logp = torch.log_softmax(pred.float(), -1)
            out_lp[i, :n_resp] = logp.gather(-1, ids[0, -n_resp:].unsqueeze(-1)).squeeze(-1)
            out_ent[i, :n_resp] = -(logp.exp() * logp).sum(-1)
    assert resp_len >= int(b["response_mask"].sum(-1).max())
    return out_lp, out_ent


@pytest.mark.parametrize("remove_padding,dynamic,mode", [(False, False, ""), (True, False, "pack"), (True, True, "pack"),
                                                          (True, False, "trim"), (True, True, "trim"),
                                                          (False, True, "")])
def test_compute_log_prob_matches_hf(remove_padding, dynamic, mode, monkeypatch):
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", mode)
    torch.set_num_threads(2)
    model = tiny_model(seed=1)
    b = make_batch(6, 7, 5, seed=3)
    mask = b["response_mask"].bool()
    ref_lp, ref_ent = hf_reference(model, b)
    cfg = actor_config(use_remove_padding=remove_padding, log_prob_micro_batch_size_per_gpu=4,
                       log_prob_use_dynamic_bsz=dynamic, log_prob_max_token_len_per_gpu=20)
    actor = DataParallelPPOActor(cfg, model)
    lp, ent = actor.compute_log_prob(DataProto.from_dict(b, meta_info={"temperature": TEMP}), calculate_entropy=True)
    assert lp.shape == b["responses"].shape and lp.dtype == torch.float32
    assert (lp - ref_lp)[mask].abs().max() <= 1e-5
    assert (ent - ref_ent)[mask].abs().max() <= 1e-5
    assert ent[mask].min() > 0


@pytest.mark.parametrize("mode", ["pack", "trim", "padded"])
def test_remove_padding_modes_agree_when_edge_columns_are_padding(mode, monkeypatch):
    """Leading prompt columns and trailing response columns that are padding in every row: "trim" drops them and
    must still return log-probs/entropies equal to HF on every valid token, zeros elsewhere, and the same
    update as the padded path."""
    torch.set_num_threads(2)
    b = make_batch(5, 8, 6, seed=4)
    b["attention_mask"][:, :3] = 0  # every prompt is at most 5 tokens
    b["attention_mask"][:, -2:] = 0  # every response is at most 4 tokens
    b["response_mask"] = b["attention_mask"][:, -6:].clone()
    b["input_ids"] = b["input_ids"] * b["attention_mask"]
    b["position_ids"] = torch.clip(torch.cumsum(b["attention_mask"], dim=-1) - 1, min=0)
    mask = b["response_mask"].bool()
    ref_lp, ref_ent = hf_reference(tiny_model(seed=1), b)
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", "" if mode == "padded" else mode)
    cfg = actor_config(use_remove_padding=mode != "padded", log_prob_micro_batch_size_per_gpu=5,
                       ppo_mini_batch_size=5, ppo_micro_batch_size_per_gpu=5)
    model = tiny_model(seed=1)
    # plain SGD so that weights compare as gradients (Adam turns round-off on ~0 gradients into +-lr steps)
    actor = DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=1e-2))
    data = DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": TEMP})
    lp, ent = actor.compute_log_prob(data, calculate_entropy=True)
    assert (lp - ref_lp)[mask].abs().max() <= 1e-5 and (ent - ref_ent)[mask].abs().max() <= 1e-5
    if mode == "trim":
        assert torch.all(lp[:, -2:] == 0) and torch.all(ent[:, -2:] == 0)
    metrics = actor.update_policy(data)
    if mode != "padded":  # the same update as the padded path
        ref = tiny_model(seed=1)
        ref_actor = DataParallelPPOActor(actor_config(log_prob_micro_batch_size_per_gpu=5, ppo_mini_batch_size=5,
                                                      ppo_micro_batch_size_per_gpu=5), ref,
                                         torch.optim.SGD(ref.parameters(), lr=1e-2))
        ref_metrics = ref_actor.update_policy(DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": TEMP}))
        assert abs(ref_metrics["actor/pg_loss"][0] - metrics["actor/pg_loss"][0]) < 1e-6
        assert abs(ref_metrics["actor/grad_norm"][0] - metrics["actor/grad_norm"][0]) < 1e-5
        for k, v in ref.state_dict().items():  # SGD: weight change = lr * gradient
            assert torch.allclose(model.state_dict()[k], v, atol=1e-7, rtol=0), k


def test_remove_padding_mode_choice(monkeypatch):
    from verl.utils.padding import remove_padding_mode, response_window, valid_column_span

    monkeypatch.delenv("VERL_REMOVE_PADDING_MODE", raising=False)
    assert remove_padding_mode(tiny_model(attn="sdpa")) == "trim"
    assert remove_padding_mode(tiny_model(attn="eager")) == "trim"

    class Flash(torch.nn.Module):
        class config:  # noqa: N801
            _attn_implementation = "flash_attention_2"

    assert remove_padding_mode(Flash()) == "pack"
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", "pack")
    assert remove_padding_mode(tiny_model()) == "pack"
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", "squash")
    with pytest.raises(ValueError, match="VERL_REMOVE_PADDING_MODE='squash'.*pack, trim"):
        remove_padding_mode(tiny_model())
    m = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0]])
    assert valid_column_span(m) == (1, 5)
    assert valid_column_span(torch.zeros(2, 4)) == (0, 0)
    # T=6, R=3: positions 2..4 score response columns 3..5
    assert response_window(6, 3, 0, 6) == (2, 5)
    assert response_window(6, 3, 1, 5) == (2, 4)  # column 5 is padding everywhere: position 4 is not needed
    assert response_window(6, 3, 0, 4) == (2, 3)
    assert response_window(6, 3, 0, 0) == (2, 2)  # nothing valid: an empty window


def _plain_update(batch, cfg, steps_data):
    model = tiny_model(seed=2)
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
    metrics = [actor.update_policy(DataProto.from_dict(copy.deepcopy(batch), meta_info={"temperature": TEMP}))
               for _ in range(steps_data)]
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def _fsdp_actor_worker(rank, world, out_dir, batch, cfg_dict):
    from omegaconf import OmegaConf

    from verl.utils.fsdp_utils import apply_fsdp2, iter_full_state_dict

    cfg = OmegaConf.create(cfg_dict)
    model = tiny_model(seed=2)
    apply_fsdp2(model, typed_actor_config(cfg).fsdp_config)
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
    per_rank = batch["input_ids"].shape[0] // world
    mine = {k: v[rank * per_rank : (rank + 1) * per_rank] for k, v in batch.items()}
    data = DataProto.from_dict(mine, meta_info={"temperature": TEMP})
    lp_before, _ = actor.compute_log_prob(data)
    metrics = [actor.update_policy(DataProto.from_dict(copy.deepcopy(mine), meta_info={"temperature": TEMP}))
               for _ in range(2)]
    names = [n for n, _ in iter_full_state_dict(model)]
    full = get_full_state_dict(model)
    if rank == 0:
        torch.save({"state": full, "names": names, "metrics": metrics, "lp": lp_before}, f"{out_dir}/fsdp.pt")


@pytest.mark.e2e
def test_two_fsdp2_ranks_match_single_process(tmp_path):
    torch.set_num_threads(2)
    batch = make_batch(8, 6, 5, seed=5)
    common = dict(use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, ppo_epochs=1)
    # reference: one process, no FSDP, padded path, fixed micro-batches of 3 rows, mini-batch of 4 rows (2 steps)
    # rank r holds rows 4r..4r+3 and takes its first 2 rows per mini-batch, so global mini-batch j is
    # rows {2j, 2j+1, 4+2j, 5+2j}: order the single-process batch the same way
    ref_cfg = actor_config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=3, **common)
    order = torch.tensor([0, 1, 4, 5, 2, 3, 6, 7])
    ref_state, ref_metrics = _plain_update({k: v[order] for k, v in batch.items()}, ref_cfg, 2)
    # 2 ranks x 2 rows per mini-batch: packed sequences, micro-batches by token budget
    cfg = actor_config(ppo_mini_batch_size=2, use_remove_padding=True, use_dynamic_bsz=True,
                       ppo_max_token_len_per_gpu=12, log_prob_max_token_len_per_gpu=12, **common)
    from omegaconf import OmegaConf

    run_distributed(_fsdp_actor_worker, 2, str(tmp_path), batch, OmegaConf.to_container(cfg), err_dir=str(tmp_path))
    got = torch.load(tmp_path / "fsdp.pt", weights_only=False)
    # tied embeddings: lm_head.weight is streamed too, equal to the embedding
    assert "lm_head.weight" in got["names"] and "model.embed_tokens.weight" in got["names"]
    assert torch.equal(got["state"]["lm_head.weight"], got["state"]["model.embed_tokens.weight"])
    changed = 0.0
    init = tiny_model(seed=2).state_dict()
    for k, v in ref_state.items():
        assert torch.allclose(got["state"][k], v, atol=1e-5, rtol=0), (k, (got["state"][k] - v).abs().max())
        changed = max(changed, (v - init[k]).abs().max().item())
    assert changed > 1e-3  # the update did move the weights
    assert len(got["metrics"][0]["actor/grad_norm"]) == 2  # 4 rows per rank / 2 per mini-batch
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/entropy",
                "actor/kl_loss", "actor/kl_coef", "actor/grad_norm"):
        assert key in got["metrics"][0], key
    # global grad norm is a property of the global mini-batch: the same on 1 and 2 ranks
    assert abs(got["metrics"][0]["actor/grad_norm"][0] - ref_metrics[0]["actor/grad_norm"][0]) < 1e-4


def test_bf16_path_runs():
    torch.set_num_threads(2)
    model = tiny_model(seed=0).to(torch.bfloat16)
    b = make_batch(4, 6, 5, seed=1)
    cfg = actor_config(use_remove_padding=True, entropy_coeff=0.01)
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
    data = DataProto.from_dict(b, meta_info={"temperature": 1.0})
    lp, ent = actor.compute_log_prob(data, calculate_entropy=True)
    ref_lp, _ = hf_reference(tiny_model(seed=0), b, 1.0)
    mask = b["response_mask"].bool()
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all()
    assert (lp - ref_lp)[mask].abs().max() < 0.1  # bf16 rounding, not a wrong token
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    metrics = actor.update_policy(data)
    assert all(torch.isfinite(torch.tensor(metrics["actor/grad_norm"])))
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)


def test_nonfinite_grad_skips_step():
    model = tiny_model(seed=0)
    b = make_batch(4, 6, 5, seed=1)
    b["advantages"][0, 0] = float("nan")
    cfg = actor_config()
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = actor.update_policy(DataProto.from_dict(b, meta_info={"temperature": 1.0}))
    assert not torch.isfinite(torch.tensor(metrics["actor/grad_norm"][0]))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_truncated_importance_sampling_is_opt_in():
    """tis_imp_ratio_cap > 0 weights the loss by min(pi_old / pi_rollout, cap); off by default."""
    b = make_batch(4, 6, 5, seed=4)
    b["rollout_log_probs"] = b["old_log_probs"] - 1.0  # pi_old / pi_rollout = e
    grads = {}
    for name, cap in (("off", -1), ("cap1", 1.0), ("cap2", 2.0)):
        model = tiny_model(seed=3)
        cfg = actor_config(tis_imp_ratio_cap=cap, grad_clip=1e9, optim={"lr": 0.0})
        actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
        grads[name] = actor.update_policy(DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": 1.0}))[
            "actor/grad_norm"][0]
    assert grads["cap1"] == pytest.approx(grads["off"], rel=1e-5)  # weight min(e, 1) = 1
    assert grads["cap2"] == pytest.approx(2 * grads["off"], rel=1e-4)  # weight min(e, 2) = 2


@pytest.mark.parametrize("mode", ["trim", "padded"])
def test_bypass_mode_reports_first_forward_log_probs(mode, monkeypatch):
    """meta_info bypass_mode: the rows of the first mini-batch (shuffled, 2 mini-batches, 2 epochs) come back with
    the log-probs/entropies of the weights before the update (= compute_log_prob then), the other rows flagged
    off; the update itself is unchanged (same parameters as without the flag)."""
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", mode)
    b = make_batch(8, 6, 5, seed=11)
    mask = b["response_mask"].bool()
    cfg = actor_config(use_remove_padding=mode == "trim", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=3,
                       ppo_epochs=2, shuffle=True, log_prob_micro_batch_size_per_gpu=8)
    states = {}
    for bypass in (False, True):
        model = tiny_model(seed=5)
        actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
        before_lp, before_ent = actor.compute_log_prob(DataProto.from_dict(copy.deepcopy(b),
                                                                           meta_info={"temperature": TEMP}),
                                                       calculate_entropy=True)
        meta = {"temperature": TEMP, "bypass_mode": bypass}
        actor.update_policy(DataProto.from_dict(copy.deepcopy(b), meta_info=meta))
        states[bypass] = {k: v.clone() for k, v in model.state_dict().items()}
        if not bypass:
            assert actor.last_on_policy is None
            continue
        got = actor.last_on_policy
        rows = got["on_policy_rows"]
        assert int(rows.sum()) == 4  # one mini-batch of the 8 rows
        # shuffle=True: the first mini-batch is not simply rows 0..3 (seeded permutation)
        gen = torch.Generator().manual_seed(42)
        expected_rows = torch.zeros(8, dtype=torch.bool)
        expected_rows[torch.randperm(8, generator=gen)[:4]] = True
        assert torch.equal(rows, expected_rows)
        sel = mask & rows[:, None]
        assert (got["on_policy_log_probs"] - before_lp)[sel].abs().max() <= 1e-6
        assert (got["on_policy_entropys"] - before_ent)[sel].abs().max() <= 1e-6
        assert got["on_policy_log_probs"][~rows].abs().sum() == 0
        after_lp, _ = actor.compute_log_prob(DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": TEMP}))
        assert (after_lp - before_lp)[mask].abs().max() > 1e-4  # the weights did move: the capture is pre-update
    for k in states[False]:
        assert torch.equal(states[False][k], states[True][k]), k


@pytest.mark.parametrize("mode", ["trim", "padded"])
def test_old_log_probs_from_the_update_forward_equal_the_trainer_pass(mode, monkeypatch):
    """meta_info old_log_probs_from_update (actor.old_log_prob_source=update): with one epoch and one mini-batch
    the update's own forward, detached, stands in for the trainer's log-prob pass. Same parameters after the
    step (float rounding) as the verl path that first scores the batch, and the captured first-forward scores
    are those log-probs; the batch needs no old_log_probs at all."""
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", mode)
    b = make_batch(8, 6, 5, seed=13)
    mask = b["response_mask"].bool()
    cfg = actor_config(use_remove_padding=mode == "trim", ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=3,
                       ppo_epochs=1, log_prob_micro_batch_size_per_gpu=8)
    states, metrics = {}, {}
    for source in ("trainer", "update"):
        model = tiny_model(seed=5)
        actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
        batch = copy.deepcopy(b)
        scored, _ = actor.compute_log_prob(DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": TEMP}))
        if source == "trainer":
            batch["old_log_probs"] = scored
        else:
            del batch["old_log_probs"]
        meta = {"temperature": TEMP, "old_log_probs_from_update": source == "update"}
        metrics[source] = actor.update_policy(DataProto.from_dict(batch, meta_info=meta))
        states[source] = {k: v.clone() for k, v in model.state_dict().items()}
        if source == "update":
            got = actor.last_on_policy
            assert bool(got["on_policy_rows"].all())
            assert (got["on_policy_log_probs"] - scored)[mask].abs().max() <= 1e-6
    assert all(v == 0.0 for v in metrics["update"]["actor/ppo_kl"])
    assert abs(sum(metrics["update"]["actor/pg_loss"]) - sum(metrics["trainer"]["actor/pg_loss"])) <= 1e-6
    moved = max((states["trainer"][k] - tiny_model(seed=5).state_dict()[k]).abs().max() for k in states["trainer"])
    assert moved > 1e-5  # the step did something
    # the same gradient up to float rounding (Adam's first step, lr 1e-2, turns rounding on near-zero gradient
    # entries into up to ~1e-5 of parameter difference: well under one step's size)
    g_trainer, g_update = metrics["trainer"]["actor/grad_norm"][0], metrics["update"]["actor/grad_norm"][0]
    assert abs(g_trainer - g_update) <= 1e-6 * g_trainer
    for k in states["trainer"]:
        assert torch.allclose(states["trainer"][k], states["update"][k], atol=1e-4, rtol=0), k


def test_old_log_probs_from_the_update_refuse_several_mini_batches():
    b = make_batch(8, 6, 5, seed=13)
    del b["old_log_probs"]
    cfg = actor_config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4, ppo_epochs=1)
    model = tiny_model(seed=5)
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
    with pytest.raises(ValueError, match="old_log_prob_source=update needs one update per batch"):
        actor.update_policy(DataProto.from_dict(b, meta_info={"temperature": TEMP, "old_log_probs_from_update": True}))


def test_gradient_checkpointing_epochs_and_shuffle():
    """Activation checkpointing changes nothing numerically; ppo_epochs x mini-batches optimizer steps."""
    from verl.utils.fsdp_utils import enable_gradient_checkpointing

    b = make_batch(8, 6, 5, seed=9)
    cfg = actor_config(ppo_mini_batch_size=4, ppo_epochs=2, shuffle=True)
    states = []
    for ckpt in (False, True):
        model = tiny_model(seed=3)
        if ckpt:
            enable_gradient_checkpointing(model)
        actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
        metrics = actor.update_policy(DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": 1.0}))
        assert len(metrics["actor/grad_norm"]) == 4 and len(metrics["actor/pg_loss"]) == 8
        states.append(model.state_dict())
    for k in states[0]:
        assert torch.allclose(states[0][k], states[1][k], atol=1e-6), k


@pytest.mark.parametrize("remove_padding", [False, True])
def test_entropy_checkpointing_makes_the_same_update(remove_padding, monkeypatch):
    """actor.entropy_checkpointing recomputes the entropy bonus in backward: same losses, same new weights."""
    b = make_batch(8, 6, 5, seed=11)
    states, losses, calls = [], [], []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    for ckpt in (False, True):
        calls.clear()
        cfg = actor_config(ppo_mini_batch_size=4, entropy_coeff=0.05, entropy_checkpointing=ckpt,
                           use_remove_padding=remove_padding)
        model = tiny_model(seed=5)
        actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
        metrics = actor.update_policy(DataProto.from_dict(copy.deepcopy(b), meta_info={"temperature": 1.0}))
        assert bool(calls) == ckpt  # the entropy went through torch.utils.checkpoint only when asked
        states.append(model.state_dict())
        losses.append(metrics["actor/entropy"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6, abs=1e-7)
    for k in states[0]:
        assert torch.allclose(states[0][k], states[1][k], atol=1e-7), k


def _lora_worker(rank, world, out_dir, batch, cfg_dict):
    from omegaconf import OmegaConf

    from verl.utils.fsdp_utils import apply_fsdp2, apply_lora, iter_full_state_dict

    cfg = OmegaConf.create(cfg_dict)
    model = apply_lora(tiny_model(seed=4), lora_rank=4, lora_alpha=8, target_modules="all-linear")
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    apply_fsdp2(model, typed_actor_config(cfg).fsdp_config)
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
    data = DataProto.from_dict({k: v[rank * 2 : rank * 2 + 2] for k, v in batch.items()}, meta_info={"temperature": 1.0})
    actor.update_policy(data)
    merged = dict(iter_full_state_dict(model))
    frozen_after = {n: p.full_tensor() for n, p in model.named_parameters() if not p.requires_grad}
    lp, _ = actor.compute_log_prob(data)
    if rank == 0:
        torch.save({"trainable": trainable, "merged": merged, "lp": lp,
                    "frozen_same": all(torch.equal(frozen_before[n], frozen_after[n]) for n in frozen_before)},
                   f"{out_dir}/lora.pt")


@pytest.mark.e2e
def test_lora_trains_adapters_and_streams_merged_weights(tmp_path):
    from omegaconf import OmegaConf

    batch = make_batch(4, 6, 5, seed=7, with_ref=False)
    cfg = actor_config(ppo_mini_batch_size=2, optim={"lr": 5e-2})
    run_distributed(_lora_worker, 2, str(tmp_path), batch, OmegaConf.to_container(cfg), err_dir=str(tmp_path))
    got = torch.load(tmp_path / "lora.pt", weights_only=False)
    assert got["trainable"] and all("lora_" in n for n in got["trainable"])
    assert got["frozen_same"]
    merged = got["merged"]
    base = tiny_model(seed=4).state_dict()
    assert set(merged) == set(base), set(merged) ^ set(base)  # plain HF names, lm_head included
    assert not torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"],
                              base["model.layers.0.self_attn.q_proj.weight"])  # adapters merged in
    assert torch.equal(merged["model.norm.weight"], base["model.norm.weight"])
    # the merged plain model reproduces the LoRA model's log-probs
    plain = tiny_model(seed=4)
    plain.load_state_dict(merged)
    b2 = {k: v[:2] for k, v in batch.items()}
    lp_plain, _ = DataParallelPPOActor(actor_config(), plain).compute_log_prob(
        DataProto.from_dict(b2, meta_info={"temperature": 1.0}))
    mask = b2["response_mask"].bool()
    assert (lp_plain - got["lp"])[mask].abs().max() < 1e-5
