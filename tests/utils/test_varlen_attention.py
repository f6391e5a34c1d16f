"""Packed rows without flash-attn (``verl_varlen`` attention) and ``use_torch_compile`` (compiled decoder layers):
the packed forward equals the padded one in float64 (log-probs, entropies, values, gradients); padded calls on a
switched model are unchanged; the FSDP engine packs where the device policy says so; a compiled engine trains to
the same result as an eager one, and a compilation failure names the key."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "workers", "actor"))
from engine_testlib import make_batch, make_model_dir, tiny_config, tiny_model  # noqa: E402

import verl.utils.varlen_attention as va  # noqa: E402
from verl.utils.compile import compile_decoder_layers, is_compiled  # noqa: E402
from verl.workers.engine.hf_forward import forward_log_probs, forward_values  # noqa: E402

TOL = 1e-10


def _grads(model, micro, remove_padding, temperature=0.7):
    model.zero_grad(set_to_none=True)
    entropy, log_probs = forward_log_probs(model, micro, temperature, True, use_remove_padding=remove_padding)
    mask = micro["response_mask"].to(log_probs.dtype)
    ((log_probs + 0.3 * entropy) * mask).sum().backward()
    return log_probs.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture
def count_calls(monkeypatch):
    calls = []
    real = va._per_sequence
    monkeypatch.setattr(va, "_per_sequence", lambda *a: calls.append(a[3].tolist()) or real(*a))
    return calls


@pytest.mark.parametrize("kv_heads", [2, 4])  # grouped-query and plain multi-head attention
def test_packed_rows_equal_the_padded_batch_in_float64(kv_heads, count_calls):
    torch.manual_seed(0)
    cfg = tiny_config()
    cfg.num_key_value_heads = kv_heads
    cfg._attn_implementation = "sdpa"
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM(cfg).double()
    micro = make_batch(bsz=5, prompt_len=7, resp_len=6, seed=3)
    padded = _grads(model, micro, remove_padding=False)
    assert va.use_varlen_attention(model) and model.config._attn_implementation == va.VARLEN_ATTENTION
    packed = _grads(model, micro, remove_padding=True)
    # one call per layer, each with the rows' borders (cumulative valid lengths)
    lengths = micro["attention_mask"].sum(-1).tolist()
    assert len(count_calls) == cfg.num_hidden_layers
    assert count_calls[0] == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    mask = micro["response_mask"].bool()
    assert (padded[0] - packed[0])[mask].abs().max() <= TOL
    assert (padded[1] - packed[1])[mask].abs().max() <= TOL
    for name, grad in padded[2].items():
        assert (grad - packed[2][name]).abs().max() <= TOL, name


def test_values_of_a_packed_value_model_equal_the_padded_ones():
    from verl.utils.model import load_value_model

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model = load_value_model(make_model_dir(tmp, seed=1), dtype="fp32").double()
    micro = make_batch(bsz=4, seed=5)
    padded = forward_values(model, micro, use_remove_padding=False)
    assert va.use_varlen_attention(model)
    packed = forward_values(model, micro, use_remove_padding=True)
    mask = micro["response_mask"].bool()
    assert (padded - packed)[mask].abs().max() <= TOL


def test_a_switched_model_computes_padded_calls_as_before():
    """Calls with a padding mask (trimmed or padded batches, generation) keep transformers' sdpa path."""
    model = tiny_model(seed=4).double()
    micro = make_batch(bsz=3, seed=6)
    before = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"],
                   position_ids=micro["position_ids"]).logits
    va.use_varlen_attention(model)
    after = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"],
                  position_ids=micro["position_ids"]).logits
    assert torch.equal(before, after)


def test_borders_from_position_ids_when_none_are_passed(count_calls):
    """A caller that packs rows itself and passes only position ids (transformers' packed-row convention)."""
    model = tiny_model(seed=5).double()
    va.use_varlen_attention(model)
    ids = torch.randint(3, 200, (1, 9))
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 0, 1, 2]])
    packed = model(input_ids=ids, position_ids=pos).logits
    assert count_calls[0] == [0, 4, 6, 9]
    for lo, hi in ((0, 4), (4, 6), (6, 9)):  # each sequence alone
        alone = model(input_ids=ids[:, lo:hi], position_ids=pos[:, lo:hi]).logits
        assert (packed[:, lo:hi] - alone).abs().max() <= TOL
    cu, longest = va.cu_seqlens_from_positions(pos)
    assert cu.tolist() == [0, 4, 6, 9] and longest == 4


def test_sliding_window_keeps_the_window():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 4, dtype=torch.float64, generator=g) for _ in range(3))
    out = va._per_sequence(q, k, v, torch.tensor([0, 7]), None, 3)[0].transpose(0, 1)  # (H, T, D)
    scores = (q[0] @ k[0].transpose(-1, -2)) / 2.0
    i = torch.arange(7)
    allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < 3)
    ref = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v[0]
    assert (out - ref).abs().max() <= TOL


def _reference_kernel(query, key, value, cu_q, max_len, *, causal, left, scale, gqa):
    """Plain per-segment attention over (T, H, D) tensors with torch's varlen window convention."""
    assert gqa or query.shape[1] == key.shape[1], "heads differ and the kernel was not told (enable_gqa)"
    outs = []
    bounds = cu_q.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
        n = end - start
        idx = torch.arange(n)
        keep = idx[None, :] <= idx[:, None] if causal else torch.ones(n, n, dtype=torch.bool)
        if left >= 0:
            keep = keep & (idx[:, None] - idx[None, :] <= left)
        outs.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale,
                                                                     enable_gqa=gqa).transpose(0, 1))
    return torch.cat(outs)


def _kernel_newest(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
                   enable_gqa=False, seqused_k=None):
    return _reference_kernel(q, k, v, cu_q, max_q, causal=window_size[1] == 0, left=window_size[0], scale=scale,
                             gqa=enable_gqa)


def _kernel_windowed(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)):
    return _reference_kernel(q, k, v, cu_q, max_q, causal=window_size[1] == 0, left=window_size[0], scale=scale,
                             gqa=False)


def _kernel_causal_flag(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
    return _reference_kernel(q, k, v, cu_q, max_q, causal=is_causal, left=-1, scale=None, gqa=False)


@pytest.mark.parametrize("kernel", [_kernel_newest, _kernel_windowed, _kernel_causal_flag])
@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("window, scale", [(None, None), (3, None), (None, 0.2)])
def test_fused_call_adapts_to_each_torch_varlen_signature(kernel, kv_heads, window, scale):
    """torch's varlen function takes different keywords across releases (is_causal only; scale and window_size;
    plus enable_gqa); each is called so that it computes the per-sequence causal attention, or declined (None)
    where it cannot express the call."""
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    q, k, v = torch.randn(1, 4, 13, 8, dtype=torch.float64), *torch.randn(2, 1, kv_heads, 13, 8, dtype=torch.float64)
    expected = va._per_sequence(q, k, v, cu, scale if scale is not None else 8**-0.5, window)
    got = va.fused_call(kernel, *(t[0].transpose(0, 1) for t in (q, k, v)), cu, 7,
                        scale if scale is not None else 8**-0.5, window)
    declines = kernel is _kernel_causal_flag and (window is not None or scale is not None)
    if declines:
        assert got is None
    else:
        torch.testing.assert_close(got.unsqueeze(0), expected, rtol=0, atol=1e-12)


def test_fp32_compute_takes_the_per_sequence_path(monkeypatch):
    """torch's fused varlen kernel is a flash kernel (fp16/bf16 only; on an H200 fp32 raised 'FlashAttention only
    support fp16 and bf16'): float32 inputs are declined before it is called, bf16 inputs reach it."""
    calls = []

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
        calls.append(q.dtype)
        return torch.zeros_like(q)

    monkeypatch.setattr(va, "torch_varlen_kernel", lambda: kernel)
    q, cu = torch.randn(1, 4, 6, 8), torch.tensor([0, 2, 6], dtype=torch.int32)
    assert va._fused(q, q, q, cu, 4, 8**-0.5, None) is None and calls == []
    half = q.bfloat16()
    assert va._fused(half, half, half, cu, 4, 8**-0.5, None).shape == (1, 6, 4, 8)
    assert calls == [torch.bfloat16]


def test_device_policy(monkeypatch):
    monkeypatch.delenv("VERL_REMOVE_PADDING_MODE", raising=False)
    assert va.packs_with_varlen_attention("cuda") and va.packs_with_varlen_attention("npu")
    assert not va.packs_with_varlen_attention("cpu")
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", "pack")
    assert va.packs_with_varlen_attention("cpu")
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", "trim")
    assert not va.packs_with_varlen_attention("cuda")


def test_flash_models_are_left_alone():
    model = tiny_model(seed=0)
    for cfg in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
        cfg._attn_implementation = "flash_attention_2"
    assert not va.use_varlen_attention(model)
    assert model.config._attn_implementation == "flash_attention_2"


# ----------------------------------------------------------------------------------------- the FSDP engine
def _engine(model_dir, **kwargs):
    from verl.workers.config import FSDPOptimizerConfig
    from verl.workers.engine import get_engine_cls
    from verl.workers.engine.config import EngineConfig

    return get_engine_cls("fsdp").build(EngineConfig(model_path=model_dir, name="actor",
                                                     optim=FSDPOptimizerConfig(lr=1e-2), grad_clip=1.0,
                                                     total_training_steps=10, **kwargs))


def _update(engine, seed=0, micro=2):
    from omegaconf import OmegaConf

    from verl.protocol import DataProto
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    actor = DataParallelPPOActor(config=OmegaConf.create(dict(
        ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=micro, ppo_epochs=1, clip_ratio=0.2,
        loss_agg_mode="token-mean", entropy_coeff=0.0, use_kl_loss=False, policy_loss={"loss_mode": "vanilla"})),
        engine=engine)
    data = DataProto.from_dict({k: v for k, v in make_batch(bsz=4, seed=seed, with_ref=False).items()})
    actor.update_policy(data)
    return actor.compute_log_prob(data)[0]


@pytest.fixture
def one_rank_group(monkeypatch):
    import torch.distributed as dist

    from engine_testlib import free_port

    monkeypatch.setenv("VERL_DEVICE", "cpu")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_engine_packs_on_request_and_trains_like_the_trimmed_batch(tmp_path, monkeypatch, one_rank_group):
    model_dir = make_model_dir(str(tmp_path / "m"), seed=7)
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", "trim")
    trimmed = _engine(model_dir, use_remove_padding=True)
    assert trimmed.module.config._attn_implementation == "sdpa"
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", "pack")
    packed = _engine(model_dir, use_remove_padding=True)
    assert packed.module.config._attn_implementation == va.VARLEN_ATTENTION
    after_trimmed, after_packed = _update(trimmed), _update(packed)
    mask = make_batch(bsz=4, seed=0)["response_mask"].bool()
    assert (after_trimmed - after_packed)[mask].abs().max() <= 1e-4  # fp32, different summation order


@pytest.mark.e2e
def test_compiled_engine_trains_like_the_eager_one(tmp_path, monkeypatch, one_rank_group):
    """``use_torch_compile=True``: each decoder layer's forward is compiled (inductor on CPU); one PPO update gives
    the same weights as eager within fp32 tolerance."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(8)
    Qwen2ForCausalLM(tiny_config(layers=1)).save_pretrained(str(tmp_path / "m"))  # one layer: one compilation
    monkeypatch.setenv("VERL_REMOVE_PADDING_MODE", "trim")
    eager = _engine(str(tmp_path / "m"), use_remove_padding=True)
    compiled = _engine(str(tmp_path / "m"), use_remove_padding=True, use_torch_compile=True)
    assert is_compiled(compiled.module) and not is_compiled(eager.module)
    mask = make_batch(bsz=4, seed=0)["response_mask"].bool()
    assert (_update(eager, micro=4) - _update(compiled, micro=4))[mask].abs().max() <= 1e-4


def test_a_compilation_failure_names_the_key(monkeypatch):
    from torch._dynamo.exc import Unsupported

    def broken_compile(fn, **kwargs):
        def run(*args, **kw):
            raise Unsupported("an operator the compiler cannot trace")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    model = tiny_model(seed=0)
    assert compile_decoder_layers(model, key="actor_rollout_ref.actor.use_torch_compile") == 2
    with pytest.raises(RuntimeError, match=r"actor_rollout_ref\.actor\.use_torch_compile=True: torch.compile failed "
                                           r"on Qwen2DecoderLayer .*set actor_rollout_ref\.actor\.use_torch_compile"
                                           r"=False"):
        model(input_ids=torch.tensor([[3, 4, 5]]))


def test_a_model_without_decoder_layers_is_refused_by_key():
    with pytest.raises(ValueError, match=r"critic.model.fsdp_config.use_torch_compile=True: no decoder layers"):
        compile_decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)), key="critic.model.fsdp_config.use_torch_compile")
