"""Rows that share a prompt (the rollout.n samples of one prompt) packed as one [prompt | r_1 | ... | r_k] row:
layout and block mask, log-probs / entropies / gradients equal to each sequence computed alone (fp64), the same
optimizer step through the engine, and the cases that keep plain rows."""

import copy

import pytest
import torch
from tensordict import TensorDict
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM, Qwen2ForTokenClassification

from verl.utils.embedded import build_config
from verl.workers.engine import FSDPEngine, MicroBatchSpec, TrainSpec
from verl.workers.engine import fsdp as fsdp_engine
from verl.workers.engine.hf_forward import forward_log_probs, forward_values
from verl.workers.engine.shared_prompt import (PAD, PROMPT, _packed_shape, forward_grouped_log_probs,
                                               forward_grouped_values, grouping_pays, pack_groups, prompt_runs)

PROMPT_LEN, RESPONSE_LEN = 8, 5


def _micro(groups):
    """Engine-layout rows from [(prompt, [response, ...]), ...]: each response a row, prompts left-padded."""
    ids, mask = [], []
    for prompt, responses in groups:
        for resp in responses:
            pad_p, pad_r = PROMPT_LEN - len(prompt), RESPONSE_LEN - len(resp)
            ids.append([0] * pad_p + prompt + resp + [0] * pad_r)
            mask.append([0] * pad_p + [1] * (len(prompt) + len(resp)) + [0] * pad_r)
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    return TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
                       "responses": ids[:, PROMPT_LEN:], "response_mask": mask[:, PROMPT_LEN:]},
                      batch_size=[len(ids)])


# three prompts: 3 samples (lengths 2, 4, 1), 1 sample, 2 samples; prompts of 3, 5 and 7 tokens
TOY = [([5, 6, 7], [[10, 11], [12, 13, 14, 15], [16]]),
       ([8, 9, 3, 4, 5], [[20, 21, 22]]),
       ([30, 31, 32, 33, 34, 35, 36], [[40, 41, 42, 43, 44], [45, 46]])]


def _qwen(dtype=torch.float64, impl="sdpa", layers=2):
    torch.manual_seed(0)
    cfg = build_config("tiny")
    cfg.num_hidden_layers = layers
    cfg._attn_implementation = impl
    return Qwen2ForCausalLM(cfg).to(dtype)


def _llama(dtype=torch.float64, impl="sdpa"):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    cfg._attn_implementation = impl
    return LlamaForCausalLM(cfg).to(dtype)


def test_runs_layout_positions_and_mask():
    micro = _micro(TOY)
    assert prompt_runs(micro["input_ids"][:, :PROMPT_LEN], micro["attention_mask"][:, :PROMPT_LEN].bool()).tolist() \
        == [0, 0, 0, 1, 2, 2]
    packed = pack_groups(micro)
    assert packed.row_group.tolist() == [0, 0, 0, 1, 2, 2]
    assert packed.first == 6 and packed.width == 7 + 7  # longest prompt + the longest run of responses (2+4+1)
    row = packed.input_ids[0].tolist()
    assert row == [0, 0, 0, 0, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16]
    assert packed.segments[0].tolist() == [PAD] * 4 + [PROMPT] * 3 + [1, 1, 2, 2, 2, 2, 3]
    assert packed.position_ids[0].tolist() == [0] * 4 + [0, 1, 2] + [3, 4, 3, 4, 5, 6, 3]
    assert packed.input_ids[2].tolist()[:7] == [30, 31, 32, 33, 34, 35, 36]
    assert packed.segments[1].tolist() == [PAD] * 2 + [PROMPT] * 5 + [1] * 3 + [PAD] * 4
    # response token j of each row is predicted by column first + src (the last prompt column for j = 0)
    assert packed.src[1].tolist()[:4] == [0, 3, 4, 5]  # second sample of the first prompt starts after 2 tokens
    assert packed.valid.sum(1).tolist() == [2, 4, 1, 3, 5, 2]
    allowed = packed.attention_mask[0, 0]
    second, third = 9, 13  # first token of sample 2, the only token of sample 3 (row 0)
    assert allowed[second, 4:7].all() and not allowed[second, 7:9].any()  # sees the prompt, not sample 1
    assert allowed[third, 4:7].all() and not allowed[third, 7:13].any() and allowed[third, third]
    assert not allowed[:, :4].any() or bool(allowed[:4, :4].diagonal().all())  # padding sees only itself


@pytest.mark.parametrize("build", [_qwen, _llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_log_probs_and_entropy_equal_each_sequence_alone_fp64(build, impl):
    model = build(torch.float64, impl)
    micro = _micro(TOY)
    atol = 1e-10 if impl == "sdpa" else 1e-6  # eager takes its softmax in fp32
    with torch.no_grad():
        out = forward_grouped_log_probs(model, micro, temperature=0.7, calculate_entropy=True)
        assert out is not None
        entropy, log_probs = out
        assert log_probs.dtype == torch.float64 and log_probs.shape == (6, RESPONSE_LEN)
        for i in range(6):
            valid = micro["attention_mask"][i].bool()
            ids = micro["input_ids"][i][valid].unsqueeze(0)
            n = int(micro["response_mask"][i].sum())
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double() / 0.7, -1)
            alone = logp[-n - 1:-1].gather(1, ids[0, -n:].unsqueeze(1)).squeeze(1)
            torch.testing.assert_close(log_probs[i, :n], alone, rtol=0, atol=atol)
            assert (log_probs[i, n:] == 0).all()
            ent_alone = -(logp.exp() * logp).sum(-1)[-n - 1:-1]
            torch.testing.assert_close(entropy[i, :n].double(), ent_alone, rtol=0, atol=1e-5)


def test_gradients_equal_the_plain_rows_fp64():
    model = _qwen(torch.float64)
    micro = _micro(TOY)
    mask = micro["response_mask"].bool()
    grads = []
    for grouped in (True, False):
        model.zero_grad()
        if grouped:
            _, lp = forward_grouped_log_probs(model, micro)
        else:
            _, lp = forward_log_probs(model, micro, 1.0, False, True)
            lp = lp.double()
        (lp[mask] * torch.linspace(-1, 1, int(mask.sum()), dtype=torch.float64)).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)  # the plain forward returns fp32 log-probs


def test_what_keeps_plain_rows():
    model = _qwen(torch.float32)
    # every prompt different: nothing to share
    distinct = _micro([([i + 3, i + 4], [[50 + i, 51]]) for i in range(4)])
    assert forward_grouped_log_probs(model, distinct) is None
    # short prompt, long responses: the packed row would be wider than it saves
    long_answers = _micro([([7], [[1, 2, 3, 4, 5]] * 2)])
    assert not grouping_pays(model, long_answers)
    # the shape the decision is made on (before packing) is the one pack_groups builds
    for micro, shape in ((long_answers, (1, 1 + 10)), (_micro(TOY), (3, 7 + 7))):
        packed = pack_groups(micro)
        assert _packed_shape(micro) == (packed.input_ids.shape[0], packed.width) == shape
    # the toy batch (longer prompts, short answers) does pay
    assert grouping_pays(model, _micro(TOY))
    # positions that do not count the row's tokens from 0 (e.g. a caller's own layout)
    shifted = _micro(TOY)
    shifted["position_ids"] = shifted["position_ids"] + 1
    assert forward_grouped_log_probs(model, shifted) is None
    # a response with a token after its padding
    holes = _micro(TOY)
    holes["attention_mask"][0, PROMPT_LEN + 3] = 1
    assert forward_grouped_log_probs(model, holes) is None


def _token_loss(out, micro, ctx):
    mask = micro["response_mask"].bool()
    loss = -(out["log_probs"][mask]).mean()
    return loss, {"loss": loss.detach()}


def _engine_shared_equals_plain(monkeypatch, grouped_fn: str, base, output: str, loss_fn, metric: str):
    """FSDPEngine with and without share_prompt_prefix on the same batch: the grouped forward ``grouped_fn`` runs
    for every micro-batch (counted), and the inferred ``output``, the loss metric and the SGD step are equal."""
    calls = []
    real = getattr(fsdp_engine, grouped_fn)

    def counting(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(fsdp_engine, grouped_fn, counting)
    from verl.protocol import DataProto

    data = DataProto(batch=_micro(TOY * 2))
    spec = TrainSpec(mini_batch_size=12, micro=MicroBatchSpec(6), outputs=(output,))
    results = {}
    for shared in (True, False):
        model = copy.deepcopy(base)
        engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=1.0), share_prompt_prefix=shared)
        inferred = engine.infer(data, (output,), MicroBatchSpec(6))[output]
        metrics = engine.train_batch(data, loss_fn, spec)
        results[shared] = (model, metrics, inferred)
    assert calls and all(calls) and len(calls) == 4  # 2 micro-batches x (infer + train), all grouped
    (m1, met1, inf1), (m2, met2, inf2) = results[True], results[False]
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(inf1[mask], inf2[mask], rtol=0, atol=1e-6)
    assert met1[metric] == pytest.approx(met2[metric], rel=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(m1.parameters(), base.parameters()))
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_engine_step_and_inference_equal_plain_rows(monkeypatch):
    """FSDPEngine with share_prompt_prefix: the grouped forward runs (counted) and the SGD step, metrics and
    inferred log-probs equal those of plain rows."""
    _engine_shared_equals_plain(monkeypatch, "forward_grouped_log_probs", _qwen(torch.float64), "log_probs",
                                _token_loss, "loss")


def test_engine_turns_it_off_for_models_that_cannot_take_the_mask():
    model = _qwen(torch.float32)
    model.config._attn_implementation = "flash_attention_2"
    assert FSDPEngine(model, share_prompt_prefix=True).share_prompt_prefix is False
    assert FSDPEngine(_qwen(torch.float32), share_prompt_prefix=True).share_prompt_prefix is True


# ----------------------------------------------------------------------------- values (the critic)

def _value_model(dtype=torch.float64):
    torch.manual_seed(0)
    cfg = build_config("tiny")
    cfg.num_hidden_layers, cfg.num_labels, cfg._attn_implementation = 2, 1, "sdpa"
    cfg.classifier_dropout = 0.0  # as verl.utils.model loads a value model
    return Qwen2ForTokenClassification(cfg).to(dtype)


def test_values_equal_each_sequence_alone_fp64():
    """V(s) before each response token from the packed rows equals the value model run on that sequence alone."""
    model = _value_model()
    micro = _micro(TOY)
    with torch.no_grad():
        values = forward_grouped_values(model, micro)
        assert values is not None and values.shape == (6, RESPONSE_LEN)
        for i in range(6):
            valid = micro["attention_mask"][i].bool()
            ids = micro["input_ids"][i][valid].unsqueeze(0)
            n = int(micro["response_mask"][i].sum())
            alone = model(input_ids=ids).logits[0, -n - 1:-1, 0]
            torch.testing.assert_close(values[i, :n].double(), alone, rtol=0, atol=1e-6)  # returned as fp32
            assert (values[i, n:] == 0).all()


def test_value_gradients_equal_the_plain_rows_fp64():
    model = _value_model()
    micro = _micro(TOY)
    mask = micro["response_mask"].bool()
    weights = torch.linspace(-1, 1, int(mask.sum()), dtype=torch.float32)
    grads = []
    for values in (lambda: forward_grouped_values(model, micro), lambda: forward_values(model, micro, True)):
        model.zero_grad()
        (values()[mask] * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def _value_loss(out, micro, ctx):
    mask = micro["response_mask"].bool()
    loss = ((out["values"] - 0.5)[mask] ** 2).mean()
    return loss, {"vf_loss": loss.detach()}


def test_critic_engine_step_and_values_equal_plain_rows(monkeypatch):
    """FSDPEngine (a value model) with share_prompt_prefix: every values forward is grouped (counted), and the
    inferred values, the loss and the SGD step equal those of plain rows."""
    _engine_shared_equals_plain(monkeypatch, "forward_grouped_values", _value_model(), "values", _value_loss,
                                "vf_loss")
