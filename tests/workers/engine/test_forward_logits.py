"""The engine's ``logits`` output: full next-token distributions aligned to the response, consistent with the
``log_probs`` output (the log-softmax of the logits at the response token), with and without padding removal."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import FullLogitsForward, make_batch, tiny_model  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.workers.engine import FSDPEngine, MicroBatchSpec, TrainSpec  # noqa: E402
from verl.workers.engine.hf_forward import forward_log_probs, forward_logits  # noqa: E402


@pytest.mark.parametrize("remove_padding", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logits_agree_with_log_probs(remove_padding, temperature):
    model = tiny_model().eval()
    batch = make_batch(bsz=6, seed=3)
    with torch.no_grad():
        logits = forward_logits(model, batch, temperature, remove_padding)
        _, log_probs = forward_log_probs(model, batch, temperature, use_remove_padding=remove_padding)
    b, r = batch["responses"].shape
    assert logits.shape == (b, r, model.config.vocab_size)
    from_logits = torch.log_softmax(logits, -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = batch["response_mask"].bool()
    assert mask.any() and torch.allclose(from_logits[mask], log_probs[mask], atol=1e-5)


def test_engine_infers_and_trains_on_logits():
    model = tiny_model()
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=0.1), use_remove_padding=True)
    data = DataProto.from_dict(dict(make_batch(bsz=4, seed=1)))
    out = engine.infer(data, ("logits", "log_probs"), MicroBatchSpec(2))
    assert out["logits"].shape[:2] == out["log_probs"].shape

    def loss_fn(outputs, micro, ctx):  # push probability mass to token 0 everywhere
        lp0 = torch.log_softmax(outputs["logits"], -1)[..., 0]
        mask = micro["response_mask"].float()
        loss = -(lp0 * mask).sum() / mask.sum()
        return loss, {"loss": loss}

    before = torch.log_softmax(out["logits"], -1)[..., 0][data.batch["response_mask"].bool()].mean()
    engine.train_batch(data, loss_fn, TrainSpec(mini_batch_size=4, micro=MicroBatchSpec(2), outputs=("logits",)))
    after = torch.log_softmax(engine.infer(data, ("logits",), MicroBatchSpec(4))["logits"], -1)[..., 0]
    assert after[data.batch["response_mask"].bool()].mean() > before


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("remove_padding", [False, True])
def test_lm_head_only_on_response_positions_gives_the_same_log_probs_and_grads(remove_padding, lora):
    from verl.workers.engine.hf_forward import accepts_logits_to_keep

    model = tiny_model().double()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    plain = FullLogitsForward(model)
    assert accepts_logits_to_keep(model) and not accepts_logits_to_keep(plain)
    batch = make_batch(bsz=5, seed=4)
    ent_a, lp_a = forward_log_probs(model, batch, 0.8, calculate_entropy=True, use_remove_padding=remove_padding)
    grads_a = torch.autograd.grad(lp_a.sum() + ent_a.sum(), [p for p in model.parameters() if p.requires_grad])
    ent_b, lp_b = forward_log_probs(plain, batch, 0.8, calculate_entropy=True, use_remove_padding=remove_padding)
    grads_b = torch.autograd.grad(lp_b.sum() + ent_b.sum(), [p for p in model.parameters() if p.requires_grad])
    assert lp_a.shape == lp_b.shape == batch["responses"].shape
    assert torch.allclose(lp_a, lp_b, atol=1e-12) and torch.allclose(ent_a, ent_b, atol=1e-12)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(grads_a, grads_b))
