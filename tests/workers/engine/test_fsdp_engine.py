"""The training engine's shared loop: loss weighting across micro-batches and ranks, row order of forward-only
passes, forward-only engines, spec checks, and the engine built from a role's config section.

The reference for every update is a plain PyTorch computation of the *global* mini-batch loss in one forward
(float64 model and SGD, so the new weights are ``w - lr * grad``). The model keeps a few float32 steps inside
(RMSNorm, rotary tables), whose rounding depends on the batch shape: updates agree to ~1e-8, while a wrong
weighting of micro-batches moves weights by ~1e-3."""

import copy
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import make_batch, make_model_dir, run_distributed, tiny_model  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.workers.engine import FSDPEngine, LossContext, MicroBatchSpec, TrainSpec  # noqa: E402
from verl.workers.engine.config import actor_engine_config, critic_engine_config  # noqa: E402
from verl.workers.engine.hf_forward import forward_log_probs  # noqa: E402

LR = 0.5


def _batch(bsz=8, seed=0):
    return DataProto.from_dict({k: v for k, v in make_batch(bsz=bsz, seed=seed).items()})


def mean_log_prob_loss(weight_by):
    """-mean log-prob, over tokens ("tokens") or as a mean of per-sequence token means ("sequences")."""
    def loss(outputs, micro, ctx):
        lp, mask = outputs["log_probs"], micro["response_mask"].to(outputs["log_probs"].dtype)
        if weight_by == "tokens":
            value = -(lp * mask).sum() / mask.sum()
        else:
            value = (-(lp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
        return value, {"loss": value}
    return loss


def reference_step(model, data, weight_by):
    """The new weights after one SGD step on the loss of the whole batch at once."""
    model = copy.deepcopy(model)
    _, lp = forward_log_probs(model, data.batch)
    loss, _ = mean_log_prob_loss(weight_by)({"log_probs": lp}, data.batch, None)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def engine_step(model, data, spec_kwargs, dp_group=None):
    model = copy.deepcopy(model)
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=LR), dp_group=dp_group,
                        use_remove_padding=True)
    metrics = engine.train_batch(data, mean_log_prob_loss(spec_kwargs.get("weight_by", "tokens")),
                                 TrainSpec(**spec_kwargs))
    return {n: p.detach().clone() for n, p in model.named_parameters()}, metrics


@pytest.mark.parametrize("weight_by", ["tokens", "sequences"])
@pytest.mark.parametrize("micro", [MicroBatchSpec(8), MicroBatchSpec(2), MicroBatchSpec(3),
                                   MicroBatchSpec(use_dynamic_bsz=True, max_token_len=24)])
def test_update_is_the_global_mini_batch_loss_however_it_is_cut(weight_by, micro):
    model = tiny_model(seed=1).double()
    data = _batch()
    want = reference_step(model, data, weight_by)
    got, metrics = engine_step(model, data, dict(mini_batch_size=8, micro=micro, weight_by=weight_by))
    assert len(metrics["grad_norm"]) == 1 and metrics["grad_norm"][0] > 0
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("weight_by", ["tokens", "sequences"])
def test_short_last_mini_batch_is_its_own_mean(weight_by):
    """8 rows in mini-batches of 6: a step on rows 0-5, then a step on rows 6-7, each the mean over its own rows
    (verl accepts a train batch that is not a multiple of the mini-batch; the last one is shorter)."""
    model = tiny_model(seed=3).double()
    data = _batch()
    first = copy.deepcopy(model)
    after_first = reference_step(model, data.slice(0, 6), weight_by)
    with torch.no_grad():
        for name, p in first.named_parameters():
            p.copy_(after_first[name])
    want = reference_step(first, data.slice(6, 8), weight_by)
    got, metrics = engine_step(model, data, dict(mini_batch_size=6, micro=MicroBatchSpec(4), weight_by=weight_by))
    assert len(metrics["grad_norm"]) == 2 and len(metrics["loss"]) == 3  # micro-batches of 4 + 2, then 2
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-7, msg=name)


def test_mini_batches_epochs_and_shuffle_take_one_step_each():
    model = tiny_model(seed=2).double()
    data = _batch()
    _, metrics = engine_step(model, data, dict(mini_batch_size=4, micro=MicroBatchSpec(2), epochs=3, shuffle=True))
    assert len(metrics["grad_norm"]) == 2 * 3  # 2 mini-batches x 3 epochs
    assert len(metrics["loss"]) == 2 * 2 * 3  # 2 micro-batches each
    # the shuffle is seeded: the same call gives the same weights
    a, _ = engine_step(model, data, dict(mini_batch_size=4, micro=MicroBatchSpec(2), epochs=2, shuffle=True, seed=5))
    b, _ = engine_step(model, data, dict(mini_batch_size=4, micro=MicroBatchSpec(2), epochs=2, shuffle=True, seed=5))
    c, _ = engine_step(model, data, dict(mini_batch_size=4, micro=MicroBatchSpec(2), epochs=2, shuffle=True, seed=6))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.equal(a[n], c[n]) for n in a)


def test_loss_context_marks_the_first_mini_batch():
    seen = []

    def loss(outputs, micro, ctx: LossContext):
        seen.append((ctx.epoch, ctx.mini_batch, ctx.micro_batch, ctx.num_micro_batches))
        return -outputs["log_probs"].mean(), {}

    model = tiny_model(seed=3)
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=0.1))
    engine.train_batch(_batch(), loss, TrainSpec(mini_batch_size=4, micro=MicroBatchSpec(2), epochs=2))
    assert seen == [(e, m, i, 2) for e in range(2) for m in range(2) for i in range(2)]


def test_infer_keeps_row_order_with_dynamic_batches():
    model = tiny_model(seed=4)
    engine = FSDPEngine(model, use_remove_padding=True)
    data = _batch(bsz=8, seed=3)
    fixed = engine.infer(data, ("log_probs", "entropy"), MicroBatchSpec(8))
    dynamic = engine.infer(data, ("log_probs", "entropy"), MicroBatchSpec(use_dynamic_bsz=True, max_token_len=20))
    with torch.no_grad():
        entropy, lp = forward_log_probs(model, data.batch, calculate_entropy=True)
    mask = data.batch["response_mask"].bool()  # trimmed all-padding columns hold zeros
    for out in (fixed, dynamic):
        torch.testing.assert_close(out["log_probs"][mask], lp[mask], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out["entropy"][mask], entropy[mask], rtol=1e-5, atol=1e-6)


def test_forward_only_engine_and_bad_specs_fail_clearly():
    engine = FSDPEngine(tiny_model(seed=5), name="ref")
    with pytest.raises(RuntimeError, match="ref: this engine is forward-only"):
        engine.train_batch(_batch(), mean_log_prob_loss("tokens"), TrainSpec(mini_batch_size=8))
    with pytest.raises(ValueError, match="mini_batch_size must be > 0"):
        TrainSpec(mini_batch_size=0)
    with pytest.raises(ValueError, match="weight_by='rows' is not one of"):
        TrainSpec(mini_batch_size=2, weight_by="rows")
    with pytest.raises(ValueError, match="unknown engine outputs"):
        TrainSpec(mini_batch_size=2, outputs=("attention_maps",))


def _two_rank_step(rank, world_size, out_dir, reduce_once):
    model = tiny_model(seed=6).double()
    data = _batch(bsz=8, seed=7)
    share = data[rank * 4:(rank + 1) * 4]  # this rank's rows
    from verl.utils.fsdp_utils import apply_fsdp2, get_full_state_dict

    sharded = apply_fsdp2(copy.deepcopy(model))  # float64: no dtype cast
    engine = FSDPEngine(sharded, torch.optim.SGD(sharded.parameters(), lr=LR))
    engine.train_batch(share, mean_log_prob_loss("tokens"),
                       TrainSpec(mini_batch_size=4, micro=MicroBatchSpec(2), reduce_grads_once=reduce_once))
    state = get_full_state_dict(sharded)
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in state.items()}, os.path.join(out_dir, f"w_{reduce_once}.pt"))


@pytest.mark.parametrize("reduce_once", [False, True])
def test_two_ranks_equal_one_process_on_the_global_batch(tmp_path, reduce_once):
    model = tiny_model(seed=6).double()
    want = reference_step(model, _batch(bsz=8, seed=7), "tokens")
    run_distributed(_two_rank_step, 2, str(tmp_path), reduce_once, err_dir=str(tmp_path))
    got = torch.load(tmp_path / f"w_{reduce_once}.pt")
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_engine_config_from_role_sections(tmp_path):
    """The builders read verl's keys once; the FSDP engine built from them trains and reports its lr."""
    from omegaconf import OmegaConf

    path = make_model_dir(str(tmp_path / "m"))
    arr = OmegaConf.create({
        "model": {"path": path, "use_remove_padding": True, "enable_gradient_checkpointing": False, "lora_rank": 0},
        "actor": {"strategy": "fsdp", "grad_clip": 0.5, "use_remove_padding": True,
                  "optim": {"lr": 1e-3, "lr_warmup_steps_ratio": 0.5, "total_training_steps": 4,
                            "lr_scheduler_type": "constant"},
                  "fsdp_config": {"model_dtype": "fp32", "seed": 3, "param_offload": True}}})
    cfg = actor_engine_config(arr)
    assert (cfg.grad_clip, cfg.use_remove_padding, cfg.seed, cfg.param_offload) == (0.5, True, 3, True)
    assert cfg.entropy_chunk_rows == 0 and cfg.freeze_vision_tower is False
    for spelling in ("entropy_from_logits_with_chunking", "fsdp_config.entropy_from_logits_with_chunking"):
        chunked = OmegaConf.merge(arr, OmegaConf.from_dotlist([f"actor.{spelling}=true"]))
        assert actor_engine_config(chunked).entropy_chunk_rows == 2048, spelling
    assert cfg.optim["lr"] == 1e-3 and cfg.total_training_steps == 4
    with pytest.raises(Exception):
        cfg.grad_clip = 1.0  # frozen
    critic = critic_engine_config(OmegaConf.create({"model": {"path": path, "fsdp_config": {}}, "optim": {"lr": 1e-2}}))
    # keys the sections leave out take the schema's defaults (critic.grad_clip 1.0, fsdp_config.seed 42, compile on)
    assert critic.model_kind == "value" and critic.grad_clip == 1.0 and critic.seed == 42
    assert critic.enable_gradient_checkpointing is True and critic.use_torch_compile is True
    assert critic.optim.lr == 1e-2 and critic.optim.clip_grad == 1.0
