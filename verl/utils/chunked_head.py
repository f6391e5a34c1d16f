"""Log-probs and entropies from hidden states without holding ``[tokens, vocab]`` logits (verl's
``use_fused_kernels``, torch backend).

A causal LM's last step is ``logits = hidden @ W.T`` (``W``: the output layer, ``[vocab, hidden]``) followed by a
log-softmax over the vocabulary. For a large vocabulary that logits tensor (plus its float32 copy, the softmax
and their gradients) is most of the memory of a policy update. :func:`chunked_log_probs` computes, ``chunk_size``
tokens at a time, only what the loss needs per token:

    log p(label) = z[label] - logsumexp(z),   H = logsumexp(z) - sum_v p_v z_v,   z = hidden @ W.T / temperature

in float32 (float64 inputs stay float64), and its backward recomputes each chunk's logits instead of keeping
them: at most one chunk of ``[chunk_size, vocab]`` exists at any time, forward or backward. Gradients:
``dz = g_logp * (onehot(label) - p) - g_H * p * (z - sum_v p_v z_v)``, then ``d hidden = dz @ W / T`` and
``dW = dz.T @ hidden / T``.

:func:`hidden_state_head` applies it to a Hugging Face causal LM: for the duration of one forward call the
model's output layer computes the chunked log-probs (and entropies) of given labels instead of logits, inside the
model's own forward, so FSDP's parameter gathering and gradient reduction work as for the plain layer.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

__all__ = ["chunked_log_probs", "hidden_state_head", "output_layer", "DEFAULT_CHUNK_SIZE"]

DEFAULT_CHUNK_SIZE = 1024  # tokens per chunk: [1024, 151936] float32 logits = 0.6 GB


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature: float, chunk_size: int, with_entropy: bool):
        n = hidden.shape[0]
        cdtype = _compute_dtype(hidden.dtype)
        log_probs = hidden.new_empty(n, dtype=cdtype)
        entropy = hidden.new_empty(n if with_entropy else 0, dtype=cdtype)
        for start in range(0, n, chunk_size):
            stop = min(start + chunk_size, n)
            z = (hidden[start:stop] @ weight.t()).to(cdtype) / temperature
            lse = torch.logsumexp(z, dim=-1)
            log_probs[start:stop] = z.gather(-1, labels[start:stop].unsqueeze(-1)).squeeze(-1) - lse
            if with_entropy:
                p = torch.exp(z - lse.unsqueeze(-1))
                entropy[start:stop] = lse - (p * z).sum(-1)
        ctx.save_for_backward(hidden, weight, labels)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, labels = ctx.saved_tensors
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        cdtype = _compute_dtype(hidden.dtype)
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=cdtype, device=weight.device) if need_weight else None
        for start in range(0, hidden.shape[0], chunk_size):
            stop = min(start + chunk_size, hidden.shape[0])
            h = hidden[start:stop]
            z = (h @ weight.t()).to(cdtype) / temperature
            p = torch.softmax(z, dim=-1)
            dz = -p * grad_log_probs[start:stop].to(cdtype).unsqueeze(-1)
            dz.scatter_add_(-1, labels[start:stop].unsqueeze(-1),
                            grad_log_probs[start:stop].to(cdtype).unsqueeze(-1))
            if ctx.with_entropy and grad_entropy is not None and grad_entropy.numel():
                mean_z = (p * z).sum(-1, keepdim=True)
                dz -= grad_entropy[start:stop].to(cdtype).unsqueeze(-1) * p * (z - mean_z)
            dz = dz / temperature
            if need_hidden:
                grad_hidden[start:stop] = (dz @ weight.to(cdtype)).to(hidden.dtype)
            if need_weight:
                grad_weight += dz.t() @ h.to(cdtype)
        if need_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def chunked_log_probs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                      chunk_size: int = DEFAULT_CHUNK_SIZE, with_entropy: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log_probs, entropy)`` of ``labels`` under ``softmax(hidden @ weight.T / temperature)`` for hidden states of
    any leading shape ``(..., H)``; entropy is None unless ``with_entropy``. Results in float32 (float64 for
    float64 inputs); see the module docstring for memory and gradients."""
    if chunk_size < 1:
        raise ValueError(f"fused_kernel_options chunk size {chunk_size} must be >= 1")
    lead = hidden.shape[:-1]
    log_probs, entropy = _ChunkedLogProbs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1),
                                                float(temperature), int(chunk_size), bool(with_entropy))
    return log_probs.reshape(lead), (entropy.reshape(lead) if with_entropy else None)


def output_layer(module: nn.Module) -> nn.Module | None:
    """The output (LM head) layer of a Hugging Face causal LM, through a PEFT wrapper; None when there is none or it
    is not a plain bias-free linear layer (the chunked path then does not apply)."""
    base = module.get_base_model() if callable(getattr(module, "get_base_model", None)) else module
    getter = getattr(base, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, nn.Linear) or head.bias is not None:
        return None
    return head


@contextlib.contextmanager
def hidden_state_head(module: nn.Module, labels: torch.Tensor, temperature: float, chunk_size: int,
                      with_entropy: bool) -> Iterator[None]:
    """Within the block, ``module``'s output layer returns ``stack([log_probs, entropy], -1)`` of ``labels``
    (shaped like the hidden states it receives, without the hidden dimension) instead of logits: one forward call
    of the model then gives ``output.logits[..., 0]`` = log-probs and ``[..., 1]`` = entropies (zeros without
    ``with_entropy``). ``labels`` must match the positions the head sees (e.g. the last ``logits_to_keep``)."""
    head = output_layer(module)
    if head is None:
        raise ValueError("use_fused_kernels needs a causal LM whose output layer is a bias-free nn.Linear")

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        log_probs, entropy = chunked_log_probs(hidden, head.weight, labels.to(hidden.device), temperature,
                                               chunk_size, with_entropy)
        return torch.stack([log_probs, entropy if entropy is not None else torch.zeros_like(log_probs)], dim=-1)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # back to the class's forward
