"""The chunked output layer (``model.use_fused_kernels``): log-probs, entropies and gradients equal the full-logits
path in float64, through the function, the engine's forward (padded, trimmed, packed rows), FSDP over 2 ranks; and
its peak memory stays under what the full-logits path needs."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "workers", "actor"))
from engine_testlib import FullLogitsForward, make_batch, run_distributed, tiny_model  # noqa: E402

from verl.utils.chunked_head import chunked_log_probs  # noqa: E402
from verl.workers.engine import hf_forward  # noqa: E402
from verl.workers.engine.hf_forward import forward_log_probs  # noqa: E402

TOL = 1e-10


def _reference(hidden, weight, labels, temperature):
    log_softmax = torch.log_softmax(hidden @ weight.t() / temperature, dim=-1)
    picked = log_softmax.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked, -(log_softmax.exp() * log_softmax).sum(-1)


@pytest.mark.parametrize("chunk", [1, 7, 37, 64])  # 37 tokens: chunks that do and do not divide them, one > all
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_full_logits_in_float64(chunk, temperature):
    g = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(37, 16, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (37,), generator=g)
    w_logp, w_ent = torch.randn(37, dtype=torch.float64, generator=g), torch.randn(37, dtype=torch.float64, generator=g)

    log_probs, entropy = chunked_log_probs(hidden, weight, labels, temperature, chunk, with_entropy=True)
    assert log_probs.dtype == torch.float64
    (log_probs * w_logp + entropy * w_ent).sum().backward()
    got = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_logp, ref_ent = _reference(hidden, weight, labels, temperature)
    (ref_logp * w_logp + ref_ent * w_ent).sum().backward()
    assert (log_probs - ref_logp).abs().max() <= TOL and (entropy - ref_ent).abs().max() <= TOL
    assert (got[0] - hidden.grad).abs().max() <= TOL and (got[1] - weight.grad).abs().max() <= TOL


def test_log_probs_alone_and_leading_shapes():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 5, 8, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 8, dtype=torch.float64, generator=g)  # frozen output layer: no gradient asked for it
    labels = torch.randint(0, 11, (3, 5), generator=g)
    log_probs, entropy = chunked_log_probs(hidden, weight, labels, chunk_size=4)
    assert entropy is None and log_probs.shape == (3, 5)
    log_probs.sum().backward()
    ref = _reference(hidden, weight, labels, 1.0)[0]
    assert (log_probs - ref).abs().max() <= TOL
    expected = torch.autograd.grad(ref.sum(), hidden)[0]
    assert (hidden.grad - expected).abs().max() <= TOL
    with pytest.raises(ValueError, match="chunk size 0"):
        chunked_log_probs(hidden, weight, labels, chunk_size=0)


def _model_grads(model, micro, temperature, remove_padding, chunk):
    """Log-probs, entropies and the parameter gradients of the log-prob sum. (The plain path computes entropies in
    float32 whatever the model's dtype, so entropies are compared with a float64 reference separately.)"""
    model.zero_grad()
    entropy, log_probs = forward_log_probs(model, micro, temperature, True, remove_padding, True, chunk)
    mask = micro["response_mask"].bool()
    log_probs[mask].sum().backward()
    return log_probs, entropy, {n: p.grad.clone() for n, p in model.named_parameters()}


def _float64_entropy(model, micro, temperature):
    """Entropy of the next-token distribution at the response-scoring positions, from full float64 logits."""
    with torch.no_grad():
        logits = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"],
                       position_ids=micro["position_ids"]).logits
    log_softmax = torch.log_softmax(logits[:, -micro["responses"].shape[1] - 1: -1] / temperature, dim=-1)
    return -(log_softmax.exp() * log_softmax).sum(-1)


@pytest.mark.parametrize("mode", ["padded", "trim", "pack", "no_logits_to_keep"])
def test_engine_forward_fused_equals_plain_in_float64(mode, monkeypatch):
    model = tiny_model(seed=2).double()
    if mode == "no_logits_to_keep":
        model = FullLogitsForward(model)
        model.get_output_embeddings = model.model.get_output_embeddings
    if mode == "pack":  # packed rows (the flash-attention layout); the same layout for both paths here
        monkeypatch.setattr(hf_forward, "remove_padding_mode", lambda module: "pack")
    micro = make_batch(bsz=5, seed=4)
    remove_padding = mode in ("trim", "pack")
    plain = _model_grads(model, micro, 0.8, remove_padding, 0)
    fused = _model_grads(model, micro, 0.8, remove_padding, 3)
    mask = micro["response_mask"].bool()
    assert (plain[0] - fused[0])[mask].abs().max() <= TOL
    for name, grad in plain[2].items():
        assert (grad - fused[2][name]).abs().max() <= TOL, name
    reference = _float64_entropy(model, micro, 0.8)
    assert (fused[1] - reference)[mask].abs().max() <= TOL
    assert (plain[1] - reference)[mask].abs().max() <= 1e-5  # the plain path's float32 entropy


def _fsdp_fused_vs_plain(rank, world_size):
    import torch.distributed as dist

    from verl.utils.fsdp_utils import apply_fsdp2

    micro = make_batch(bsz=4, seed=10 + rank)  # each rank its own rows, as data parallel
    results = []
    for chunk in (0, 5):
        model = apply_fsdp2(tiny_model(seed=3).double())  # float64: no dtype cast
        entropy, log_probs = forward_log_probs(model, micro, 1.0, True, True, True, chunk)
        mask = micro["response_mask"].bool()
        log_probs[mask].sum().backward()
        grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        results.append((log_probs.detach(), grads))
    (plain_lp, plain_g), (fused_lp, fused_g) = results
    assert (plain_lp - fused_lp).abs().max() <= TOL
    for name in plain_g:
        assert (plain_g[name] - fused_g[name]).abs().max() <= TOL, name
    dist.barrier()


@pytest.mark.e2e
def test_fused_equals_plain_under_fsdp_two_ranks(tmp_path):
    run_distributed(_fsdp_fused_vs_plain, 2, err_dir=str(tmp_path))


PEAK_SCRIPT = textwrap.dedent('''
    import resource, sys, torch
    from verl.utils.chunked_head import chunked_log_probs
    torch.set_num_threads(2)
    fused = sys.argv[1] == "fused"
    g = torch.Generator().manual_seed(0)
    tokens, hidden_size, vocab = 1024, 64, 150_000
    hidden = torch.randn(tokens, hidden_size, generator=g, requires_grad=True)
    weight = (0.02 * torch.randn(vocab, hidden_size, generator=g)).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if fused:
        log_probs, entropy = chunked_log_probs(hidden, weight, labels, chunk_size=256, with_entropy=True)
    else:
        log_softmax = torch.log_softmax(hidden @ weight.t(), dim=-1)
        log_probs = log_softmax.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    (log_probs.sum() + entropy.sum()).backward()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)  # MiB above the inputs
''')


def _peak_mib(kind: str) -> float:
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, kind], capture_output=True, text=True, check=True,
                         env=dict(os.environ, OMP_NUM_THREADS="2"))
    return float(out.stdout.strip().splitlines()[-1])


def test_peak_memory_stays_under_the_full_logits_path():
    """1024 tokens x 150K vocabulary: full float32 logits alone are 0.57 GiB (several times that with the softmax
    and the gradients); the chunked head holds one 256-token chunk (0.15 GiB) at a time, plus the output layer's
    gradient (37 MiB). Seen: chunked 0.75 GiB, full logits 2.7 GiB above the inputs."""
    fused, full = _peak_mib("fused"), _peak_mib("full")
    print(f"[measure] peak RSS above inputs: chunked {fused:.0f} MiB, full logits {full:.0f} MiB")
    assert fused < 1536 < full, (fused, full)
