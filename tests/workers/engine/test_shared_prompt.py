"""Preference pairs packed as one [prompt | chosen | rejected] row: the block mask and positions, log-probs equal
to the two-row layout (fp32) and to each sequence computed alone (fp64), the same optimizer step, and the cases
that keep the two-row layout."""

import copy

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM

from verl.trainer.preference import REF_KEY, PairwisePreferenceLoss, pair_train_spec
from verl.trainer.preference.dataset import PreferenceDataset
from verl.utils.embedded import build_config, load_tokenizer
from verl.utils.embedded.preferences import make_preference_rows
from verl.workers.engine import FSDPEngine, MicroBatchSpec, TrainSpec
from verl.workers.engine.hf_forward import forward_log_probs
from verl.workers.engine.shared_prompt import (CHOSEN, PAD, PROMPT, REJECTED, forward_shared_prompt_log_probs,
                                               pack_pairs, unsupported_reason)

PROMPT_LEN, RESPONSE_LEN = 6, 4


def _row(prompt, response):
    """One row of the engine layout: prompt left-padded to PROMPT_LEN, response right-padded to RESPONSE_LEN."""
    ids = [0] * (PROMPT_LEN - len(prompt)) + prompt + response + [0] * (RESPONSE_LEN - len(response))
    mask = [0] * (PROMPT_LEN - len(prompt)) + [1] * (len(prompt) + len(response)) + [0] * (RESPONSE_LEN - len(response))
    return ids, mask


def _micro(pairs):
    """An interleaved micro-batch from [(prompt, chosen, rejected), ...] token lists."""
    rows = [_row(p, resp) for p, c, r in pairs for resp in (c, r)]
    ids = torch.tensor([r[0] for r in rows])
    mask = torch.tensor([r[1] for r in rows])
    return TensorDict({"input_ids": ids, "attention_mask": mask,
                       "position_ids": (mask.cumsum(1) - 1).clamp(min=0), "responses": ids[:, PROMPT_LEN:],
                       "response_mask": mask[:, PROMPT_LEN:]}, batch_size=[len(rows)])


TOY = [([5, 6, 7], [10, 11], [20, 21, 22]),   # p=3, c=2, r=3
       ([8, 9, 3, 4, 5], [12], [23, 24])]     # p=5, c=1, r=2


def test_packing_layout_positions_and_block_mask():
    packed = pack_pairs(_micro(TOY))
    # width: longest prompt (5) + longest chosen+rejected (2+3); every chosen response starts in column 5
    assert packed.input_ids.shape == (2, 10) and packed.first == 4
    assert packed.input_ids[0].tolist() == [0, 0, 5, 6, 7, 10, 11, 20, 21, 22]
    assert packed.input_ids[1].tolist()[:8] == [8, 9, 3, 4, 5, 12, 23, 24]
    assert packed.segments[0].tolist() == [PAD, PAD] + [PROMPT] * 3 + [CHOSEN] * 2 + [REJECTED] * 3
    assert packed.segments[1].tolist() == [PROMPT] * 5 + [CHOSEN] + [REJECTED] * 2 + [PAD] * 2
    # rejected positions restart where the prompt ends, as in the rejected row alone
    assert packed.position_ids[0].tolist()[2:] == [0, 1, 2, 3, 4, 3, 4, 5]
    assert packed.position_ids[1].tolist()[:8] == [0, 1, 2, 3, 4, 5, 5, 6]
    allowed = packed.attention_mask[:, 0]
    seg = packed.segments
    for b in range(2):
        for q in range(10):
            for k in range(10):
                if seg[b, q] == PAD:
                    want = q == k
                else:
                    want = k <= q and seg[b, k] != PAD and seg[b, k] in (PROMPT, seg[b, q])
                assert bool(allowed[b, q, k]) == want, (b, q, k)
    # a rejected token never sees a chosen token; it sees the whole prompt
    assert not allowed[0, 7:, 5:7].any() and allowed[0, 9, 2:5].all()
    # the logits of the last prompt column predict both first tokens; then each segment's previous column
    assert packed.src[0, :2].tolist() == [0, 1] and packed.src[1, :3].tolist() == [0, 3, 4]  # chosen, rejected
    assert packed.valid[2].tolist() == [True, False, False, False]  # the chosen response of pair 1
    assert packed.row_group.tolist() == [0, 0, 1, 1]


def test_packing_refuses_rows_that_are_not_pairs_of_one_prompt():
    micro = _micro(TOY)
    micro["input_ids"][1, PROMPT_LEN - 1] = 99  # the rejected row of pair 0 has another prompt
    with pytest.raises(ValueError, match="same prompt"):
        pack_pairs(micro)
    with pytest.raises(ValueError, match="even number of rows"):
        pack_pairs(_micro(TOY)[:3])
    bad = _micro(TOY)
    bad["attention_mask"][0, PROMPT_LEN + 1] = 0  # a hole inside the response: not right-padded
    bad["attention_mask"][0, PROMPT_LEN + 2] = 1
    with pytest.raises(ValueError, match="right-padded"):
        pack_pairs(bad)


def _qwen(impl, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = build_config("tiny")
    cfg.num_hidden_layers = 2
    cfg._attn_implementation = impl
    return Qwen2ForCausalLM(cfg).to(dtype)


def _llama(impl, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    cfg._attn_implementation = impl
    return LlamaForCausalLM(cfg).to(dtype)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    import pandas as pd

    path = tmp_path_factory.mktemp("shared_prompt") / "p.parquet"
    pd.DataFrame(make_preference_rows(12, seed=5)).to_parquet(path)
    ds = PreferenceDataset(str(path), load_tokenizer(), OmegaConf.create({"max_prompt_length": 40,
                                                                          "max_response_length": 6}))
    batch = ds.pairs(range(12))
    lengths = batch.batch["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) > 1  # prompts / answers of several lengths
    batch.batch[REF_KEY] = -torch.rand(24, generator=torch.Generator().manual_seed(0)) * 10
    return batch


@pytest.mark.parametrize("build", [_qwen, _llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_log_probs_equal_the_two_row_layout_fp32(pairs, build, impl):
    model = build(impl)
    assert unsupported_reason(model) is None
    mask = pairs.batch["response_mask"].bool()
    with torch.no_grad():
        _, rows = forward_log_probs(model, pairs.batch, 1.0, False, True, True)      # trimmed two-row layout
        _, packed = forward_shared_prompt_log_probs(model, pairs.batch)
        _, hot = forward_shared_prompt_log_probs(model, pairs.batch, temperature=0.7)
        _, rows_hot = forward_log_probs(model, pairs.batch, 0.7, False, True, True)
    assert packed.shape == rows.shape and packed.dtype == torch.float32
    torch.testing.assert_close(packed[mask], rows[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(hot[mask], rows_hot[mask], rtol=0, atol=1e-5)
    assert (packed[~mask] == 0).all()


@pytest.mark.parametrize("build", [_qwen, _llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_log_probs_equal_each_sequence_alone_fp64(pairs, build, impl):
    """fp64: every response token's log-prob equals that of its (prompt + response) computed alone, unpadded.
    (Eager attention takes its softmax in fp32 whatever the model's dtype, hence its looser bound.)"""
    model = build(impl, torch.float64)
    atol = 1e-10 if impl == "sdpa" else 1e-6
    b = pairs.batch
    with torch.no_grad():
        _, packed = forward_shared_prompt_log_probs(model, b)
        assert packed.dtype == torch.float64
        for i in range(b["input_ids"].shape[0]):
            valid = b["attention_mask"][i].bool()
            ids = b["input_ids"][i][valid].unsqueeze(0)
            n = int(b["response_mask"][i].sum())
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            alone = logp[-n - 1:-1].gather(1, ids[0, -n:].unsqueeze(1)).squeeze(1)
            torch.testing.assert_close(packed[i, :n], alone, rtol=0, atol=atol)


def _train(model, pairs, shared, micro_pairs=3):
    model = copy.deepcopy(model)
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=1.0))
    spec = pair_train_spec(len(pairs) // 2, micro_pairs)
    spec = TrainSpec(**{**spec.__dict__, "shared_prompt": shared})
    metrics = engine.train_batch(pairs, PairwisePreferenceLoss("sigmoid", beta=0.5), spec)
    return model, metrics


def test_packed_optimizer_step_equals_the_two_row_step(pairs):
    """Same SGD step (lr 1) and metrics; an fp64 model, bounded by the two-row forward's fp32 log-probs."""
    model = _qwen("sdpa", torch.float64)
    two, m2 = _train(model, pairs, False)
    one, m1 = _train(model, pairs, True)
    assert any(not torch.equal(a, b) for a, b in zip(one.parameters(), model.parameters()))
    for a, b in zip(one.parameters(), two.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for key in ("actor/dpo_loss", "rewards/margins", "logps/chosen", "actor/grad_norm"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-6, abs=1e-9), key


def test_lora_model_and_its_reference_with_adapters_off(pairs):
    """A LoRA actor (peft wrapper, no logits_to_keep in its signature) and its reference (adapters off)."""
    from verl.utils.fsdp_utils import apply_lora

    model = apply_lora(_qwen("sdpa"), lora_rank=4)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # adapters that change the outputs
    engine = FSDPEngine(model)
    assert engine.shared_prompt_unsupported() is None
    mask = pairs.batch["response_mask"].bool()
    packed = []
    for ctx in (engine.disable_adapter, None):
        with (ctx() if ctx else torch.enable_grad()):
            two = engine.infer(pairs, ("log_probs",), MicroBatchSpec(24))["log_probs"]
            one = engine.infer(pairs, ("log_probs",), MicroBatchSpec(24), shared_prompt=True)["log_probs"]
        torch.testing.assert_close(one[mask], two[mask], rtol=0, atol=1e-5)
        packed.append(one)
    assert (packed[0][mask] - packed[1][mask]).abs().max() > 1e-3  # the adapters were off, then on


def test_infer_with_shared_prompt_matches_and_checks_micro_batches(pairs):
    engine = FSDPEngine(_qwen("sdpa"))
    two = engine.infer(pairs, ("log_probs",), MicroBatchSpec(8))["log_probs"]
    one = engine.infer(pairs, ("log_probs",), MicroBatchSpec(8), shared_prompt=True)["log_probs"]
    mask = pairs.batch["response_mask"].bool()
    torch.testing.assert_close(one[mask], two[mask], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="even number of rows"):
        engine.infer(pairs, ("log_probs",), MicroBatchSpec(5), shared_prompt=True)
    with pytest.raises(ValueError, match="even number of rows"):
        TrainSpec(mini_batch_size=8, micro=MicroBatchSpec(3), shared_prompt=True)
    with pytest.raises(ValueError, match="log_probs and entropy"):
        engine.forward_shared_prompt(pairs.batch, ("values",), 1.0, False)


def test_models_and_kernels_that_keep_two_rows():
    assert unsupported_reason(_qwen("sdpa")) is None
    flash = _qwen("sdpa")
    flash.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in unsupported_reason(flash)
    sliding = _qwen("sdpa")
    sliding.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding" in unsupported_reason(sliding)
    gpt2 = copy.deepcopy(_qwen("sdpa"))
    gpt2.config.model_type = "gpt2"
    assert "'gpt2'" in unsupported_reason(gpt2)
    assert FSDPEngine(_qwen("eager")).shared_prompt_unsupported() is None
