"""Packed rows without flash-attn on a real GPU (``verl_varlen``: PyTorch's variable-length flash kernel, else one
sdpa call per sequence), and compiled decoder layers (``use_torch_compile``): the same log-probs and gradients as
the padded batch.

Skipped where there is no CUDA GPU (every CI machine of this project). Run on a GPU machine with
``python -m pytest -q tests/gpu``.
"""

import os
import sys

import pytest
import torch

import verl.utils.varlen_attention as va
from verl.utils.compile import compile_decoder_layers
from verl.workers.engine.hf_forward import forward_log_probs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers", "actor"))
from engine_testlib import make_batch, tiny_model  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _run(model, micro, remove_padding):
    model.zero_grad()
    entropy, log_probs = forward_log_probs(model, micro, 0.9, True, use_remove_padding=remove_padding)
    mask = micro["response_mask"].bool()
    (log_probs[mask].sum() + 0.1 * entropy[mask].sum()).backward()
    return log_probs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-4), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("fused_kernel", [True, False])
def test_packed_rows_equal_the_padded_batch_on_cuda(dtype, atol, fused_kernel, monkeypatch):
    if fused_kernel and va.torch_varlen_kernel() is None:
        pytest.skip("this torch has no torch.nn.attention.varlen kernel")
    if not fused_kernel:
        monkeypatch.setattr(va, "torch_varlen_kernel", lambda: None)
    model = tiny_model(seed=3).to("cuda", dtype)
    micro = {k: v.cuda() for k, v in make_batch(bsz=6, prompt_len=9, resp_len=7, seed=1).items()}
    padded = _run(model, micro, False)
    assert va.use_varlen_attention(model)
    packed = _run(model, micro, True)
    mask = micro["response_mask"].bool()
    assert (padded[0] - packed[0])[mask].abs().max() <= atol
    for name, grad in padded[1].items():
        assert torch.allclose(grad.float(), packed[1][name].float(), atol=atol * 10, rtol=1e-2), name


def test_engine_device_policy_packs_on_cuda(monkeypatch):
    monkeypatch.delenv("VERL_REMOVE_PADDING_MODE", raising=False)
    assert va.packs_with_varlen_attention("cuda")


def test_compiled_layers_equal_eager_on_cuda():
    model = tiny_model(seed=4).cuda()
    micro = {k: v.cuda() for k, v in make_batch(bsz=4, seed=2).items()}
    va.use_varlen_attention(model)
    eager = _run(model, micro, True)
    compile_decoder_layers(model, key="actor_rollout_ref.actor.use_torch_compile")
    compiled = _run(model, micro, True)
    mask = micro["response_mask"].bool()
    assert (eager[0] - compiled[0])[mask].abs().max() <= 1e-4
