"""The chunked output layer (``model.use_fused_kernels=True``) on a real GPU: same log-probs, entropies and
gradients as the full-logits path, and a lower allocation peak for a large vocabulary.

Skipped where there is no CUDA GPU (every CI machine of this project). Run on a GPU machine with
``python -m pytest -q tests/gpu``.
"""

import os
import sys

import pytest
import torch

from verl.utils.chunked_head import chunked_log_probs
from verl.workers.engine.hf_forward import forward_log_probs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers", "actor"))
from engine_testlib import make_batch, tiny_model  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _grads(model, micro, chunk):
    model.zero_grad()
    entropy, log_probs = forward_log_probs(model, micro, 0.9, True, False, True, chunk)
    mask = micro["response_mask"].bool()
    log_probs[mask].sum().backward()
    return log_probs, entropy, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_engine_forward_fused_equals_plain_on_cuda():
    model = tiny_model(seed=5).cuda()
    micro = {k: v.cuda() for k, v in make_batch(bsz=6, seed=2).items()}
    plain, fused = _grads(model, micro, 0), _grads(model, micro, 4)
    mask = micro["response_mask"].bool()
    assert (plain[0] - fused[0])[mask].abs().max() <= 1e-5
    assert (plain[1] - fused[1])[mask].abs().max() <= 1e-4
    for name, grad in plain[2].items():
        assert torch.allclose(grad, fused[2][name], atol=1e-5, rtol=1e-4), name


def test_allocation_peak_below_the_full_logits_path():
    g = torch.Generator(device="cuda").manual_seed(0)
    tokens, hidden_size, vocab = 8192, 1536, 151_936
    hidden = torch.randn(tokens, hidden_size, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
    weight = (0.02 * torch.randn(vocab, hidden_size, device="cuda", dtype=torch.bfloat16, generator=g)).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)

    def peak(fn) -> float:
        hidden.grad = weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        log_probs, entropy = fn()
        (log_probs.sum() + entropy.sum()).backward()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 1024**3

    def full():
        log_softmax = torch.log_softmax((hidden @ weight.t()).float(), dim=-1)
        return log_softmax.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(log_softmax.exp() * log_softmax).sum(-1)

    chunked = peak(lambda: chunked_log_probs(hidden, weight, labels, chunk_size=1024, with_entropy=True))
    full_logits = peak(full)
    print(f"[measure] cuda allocation peak: chunked {chunked:.2f} GiB, full logits {full_logits:.2f} GiB")
    assert chunked < 0.5 * full_logits, (chunked, full_logits)
