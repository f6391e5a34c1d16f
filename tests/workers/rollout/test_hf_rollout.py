"""HFRollout on the embedded tiny model: shapes, sample order, EOS/mask handling, greedy determinism, and
rollout_log_probs against a plain HF forward of the sampled sequences."""

import pytest
import torch

from verl.protocol import DataProto
from verl.workers.rollout import BaseRollout, get_rollout_class
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.utils import filter_logits_top_k_top_p, response_mask_from_eos, sampling_params_for

R = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl.utils.embedded import make_model_dir

    return make_model_dir(str(tmp_path_factory.mktemp("tiny")), size="tiny")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    return tok


def make_prompts(tokenizer, texts=("1+2=", "12+30=", "7*7=")):
    enc = tokenizer(list(texts), return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    return DataProto.from_dict({"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": pos})


def rollout_cfg(**kw):
    cfg = dict(name="hf", n=1, temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, response_length=R,
               dtype="float32", val_kwargs=dict(n=1, temperature=0, top_p=1.0, top_k=-1, do_sample=False))
    cfg.update(kw)
    return cfg


def hf_logprobs(module, out):
    """log_softmax(logits / T) of each response token from one full forward pass (no KV cache)."""
    with torch.no_grad():
        logits = module(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                        position_ids=out.batch["position_ids"]).logits.float()
    resp = out.batch["responses"]
    return torch.log_softmax(logits[:, -resp.size(1) - 1:-1], -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)


def test_factory():
    assert get_rollout_class("hf") is HFRollout
    assert issubclass(HFRollout, BaseRollout)
    with pytest.raises(ValueError, match="rollout.name"):
        get_rollout_class("nope")
    try:
        cls = get_rollout_class("sglang")
    except ImportError as err:  # engine or adapter not installed here: the error says what to do
        assert "rollout.name" in str(err)
    else:
        assert issubclass(cls, BaseRollout)


def test_n_samples_shapes_and_logprobs(model_dir, tokenizer):
    torch.manual_seed(0)
    rollout = HFRollout(rollout_cfg(n=3), model_dir)
    prompts = make_prompts(tokenizer)
    out = rollout.generate_sequences(prompts)
    B, P = prompts.batch["input_ids"].shape
    assert len(out) == 3 * B
    assert out.batch["responses"].shape == (3 * B, R)
    assert out.batch["input_ids"].shape == (3 * B, P + R)
    assert out.batch["attention_mask"].shape == (3 * B, P + R)
    assert out.batch["rollout_log_probs"].dtype == torch.float32
    # interleaved: rows 3i..3i+2 belong to prompt i
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(3, 0))
    # samples of one prompt differ (temperature 1 on a random model)
    assert not torch.equal(out.batch["responses"][0], out.batch["responses"][1])
    # positions continue after the prompt
    pos = out.batch["position_ids"]
    assert torch.equal(pos[:, P:] - pos[:, P - 1:P], torch.arange(1, R + 1).expand(3 * B, R))
    diff = (hf_logprobs(rollout.module, out) - out.batch["rollout_log_probs"]).abs()
    mask = out.batch["attention_mask"][:, -R:]
    assert float((diff * mask).max()) <= 1e-5


def test_logprobs_at_temperature_with_topk(model_dir, tokenizer):
    """Reported logprobs are log_softmax(logits / T) before top-k filtering; samples respect top-k."""
    torch.manual_seed(1)
    rollout = HFRollout(rollout_cfg(n=2, temperature=0.7, top_k=5), model_dir)
    out = rollout.generate_sequences(make_prompts(tokenizer))
    with torch.no_grad():
        logits = rollout.module(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                                position_ids=out.batch["position_ids"]).logits.float()[:, -R - 1:-1]
    expect = torch.log_softmax(logits / 0.7, -1).gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = out.batch["attention_mask"][:, -R:]
    assert float(((expect - out.batch["rollout_log_probs"]).abs() * mask).max()) <= 1e-5
    rank = (logits > logits.gather(-1, out.batch["responses"].unsqueeze(-1))).sum(-1)
    assert int((rank * mask).max()) < 5


def test_eos_mask_and_padding(model_dir, tokenizer):
    # half the vocabulary counts as EOS so every sample stops early
    eos_ids = list(range(0, 256, 2))
    pad = tokenizer.pad_token_id
    torch.manual_seed(2)
    rollout = HFRollout(rollout_cfg(n=4), model_dir)
    prompts = make_prompts(tokenizer)
    prompts.meta_info.update(eos_token_id=eos_ids, pad_token_id=pad)
    out = rollout.generate_sequences(prompts)
    resp, mask = out.batch["responses"], out.batch["attention_mask"][:, -R:]
    lp = out.batch["rollout_log_probs"]
    stopped = 0
    for row in range(len(out)):
        is_eos = torch.isin(resp[row], torch.tensor(eos_ids))
        if is_eos.any():
            first = int(is_eos.nonzero()[0])
            stopped += 1
            assert mask[row, : first + 1].eq(1).all() and mask[row, first + 1:].eq(0).all()
            assert resp[row, first + 1:].eq(pad).all()
            assert lp[row, first + 1:].eq(0).all() and lp[row, : first + 1].lt(0).all()
        else:
            assert mask[row].eq(1).all()
    assert stopped >= len(out) - 1
    assert out.meta_info["eos_token_id"] == eos_ids


def test_greedy_and_validate(model_dir, tokenizer):
    rollout = HFRollout(rollout_cfg(n=3), model_dir)
    prompts = make_prompts(tokenizer)
    prompts.meta_info["validate"] = True  # val_kwargs: greedy, n=1
    a = rollout.generate_sequences(prompts)
    b = rollout.generate_sequences(prompts)
    assert len(a) == len(prompts)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    with torch.no_grad():
        logits = rollout.module(input_ids=a.batch["input_ids"], attention_mask=a.batch["attention_mask"],
                                position_ids=a.batch["position_ids"]).logits[:, -R - 1:-1]
    assert torch.equal(logits.argmax(-1), a.batch["responses"])
    greedy = make_prompts(tokenizer)
    greedy.meta_info["do_sample"] = False
    assert torch.equal(rollout.generate_sequences(greedy).batch["responses"], a.batch["responses"])


def test_update_weights_by_name(model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    rollout = HFRollout(rollout_cfg(), model_dir)
    other = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rollout.update_weights(other.state_dict().items())  # includes the tied lm_head.weight
    for name, p in rollout.module.state_dict().items():
        assert torch.equal(p, other.state_dict()[name]), name
    with pytest.raises(KeyError, match="unknown"):
        rollout.update_weights([("model.not_a_param.weight", torch.zeros(1))])


def test_sampling_helpers():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    assert torch.isinf(filter_logits_top_k_top_p(logits, top_k=2)).tolist() == [[False, False, True, True]]
    p = torch.softmax(logits, -1)[0]
    kept = ~torch.isinf(filter_logits_top_k_top_p(logits, top_p=float(p[0]) + 1e-3))
    assert kept.tolist() == [[True, True, False, False]]
    resp = torch.tensor([[5, 2, 7, 2], [1, 1, 1, 1]])
    assert response_mask_from_eos(resp, [2]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    cfg = rollout_cfg(n=4)
    assert sampling_params_for(cfg, {})["n"] == 4
    assert sampling_params_for(cfg, {"validate": True}) == dict(n=1, temperature=0.0, top_p=1.0, top_k=-1,
                                                                do_sample=False)


def test_strip_wrapper_prefixes_works_on_whole_segments():
    from verl.workers.rollout.hf_rollout import _strip_wrapper_prefixes

    assert _strip_wrapper_prefixes("_fsdp_wrapped_module.model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert _strip_wrapper_prefixes("module._orig_mod.lm_head.weight") == "lm_head.weight"
    assert _strip_wrapper_prefixes("model.my_module.weight") == "model.my_module.weight"


@pytest.mark.parametrize("config, override", [
    (dict(temperature=0.7, top_p=0.9, top_k=20), {}),
    (dict(temperature=0.7, top_p=0.9, top_k=20), {"do_sample": False}),
    (dict(temperature=0.0, top_p=0.5), {}),
    ({}, {"do_sample": True}),
])
def test_batch_and_request_paths_resolve_sampling_alike(config, override):
    """One builder for both paths: a batch call (``generate_sequences``) and a request (agent loop / async server)
    with the same config and the same override get the same temperature, top-p, top-k and greedy switch."""
    from verl.workers.rollout.async_server import request_sampling_params

    batch = sampling_params_for(config, dict(override))
    request = request_sampling_params(dict(config, response_length=8), override)
    assert {k: batch[k] for k in ("temperature", "top_p", "top_k", "do_sample")} == \
        {k: request[k] for k in ("temperature", "top_p", "top_k", "do_sample")}
    greedy = config.get("temperature", 1.0) <= 0 or override.get("do_sample") is False
    assert batch["do_sample"] is (not greedy) and (batch["temperature"] == 0.0) is greedy
    assert request["max_tokens"] == 8 and "n" not in request


def test_special_tokens_resolve_in_one_order():
    """One EOS/pad resolution for every rollout and the workers: the first source that sets each wins; a missing
    pad token falls back to the first EOS id, then 0."""
    from types import SimpleNamespace as NS

    from verl.workers.rollout.utils import resolve_special_tokens

    gen, tok = NS(eos_token_id=[7, 8], pad_token_id=None), NS(eos_token_id=2, pad_token_id=3)
    assert resolve_special_tokens(gen, tok) == ([7, 8], 3)
    assert resolve_special_tokens(None, tok, gen) == (2, 3)
    assert resolve_special_tokens(gen) == ([7, 8], 7)
    assert resolve_special_tokens(NS(), None) == (None, 0)


def test_per_expert_tensors_fill_the_fused_experts_of_a_moe_model(tmp_path):
    """The Megatron engine exports one matrix per expert (checkpoint names); transformers 5 MoE models keep a
    layer's experts fused (gate_up_proj (E, 2I, H), down_proj (E, H, I)). A push of another model's per-expert
    tensors leaves the rollout model equal to that model, parameter by parameter; a name with no home still fails."""
    from verl.utils.hf_experts import unfuse_expert_weights
    from tests.workers.engine.test_megatron_moe import make_moe_dir

    source = HFRollout(rollout_cfg(), make_moe_dir(str(tmp_path / "a"), seed=0))
    rollout = HFRollout(rollout_cfg(), make_moe_dir(str(tmp_path / "b"), seed=1))
    fused = [n for n, _ in source.module.named_parameters() if n.endswith("experts.gate_up_proj")]
    assert fused  # the model does keep its experts fused
    pushed = list(unfuse_expert_weights(source.module.named_parameters()))
    assert any(".experts.3.up_proj.weight" in n for n, _ in pushed)
    target = dict(rollout.module.named_parameters())
    assert not all(torch.equal(p, target[n]) for n, p in source.module.named_parameters())
    rollout.update_weights(pushed)
    for name, param in source.module.named_parameters():
        torch.testing.assert_close(target[name], param, rtol=0, atol=0)
    with pytest.raises(KeyError, match="unknown to the rollout model"):
        rollout.update_weights([("model.layers.0.mlp.experts.9.gate_proj.weight", torch.zeros(32, 64))])
