"""Log-probabilities and entropies from vocabulary-parallel logits (each tensor rank holds a slice of the
vocabulary), without gathering the full logits.

With ``m`` the (detached) global max, ``S = sum_v exp(l_v - m)`` over all ranks and ``lse = log S``:
``log p(y) = (l_y - m) - lse`` and ``H = lse - sum_v p_v (l_v - m)``. The cross-rank sums use megatron's
``reduce_from_tensor_model_parallel_region`` (all-reduce forward, identity backward): every tensor rank
computes the same loss, so each rank's slice receives exactly its own gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.utils.checkpoint

__all__ = ["vocab_parallel_log_probs", "chunked_vocab_parallel_log_probs"]


def vocab_parallel_log_probs(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, *,
                             with_entropy: bool = False, entropy_grad: bool = True):
    """``(log_probs, entropy or None)`` of ``labels`` under ``logits`` (..., V_local), float32.

    ``vocab_size``: the real vocabulary (columns at or beyond it are padding and get probability 0).
    """
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region as reduce_tp

    tp = ps.get_tensor_model_parallel_world_size()
    rank = ps.get_tensor_model_parallel_rank()
    logits = logits.float()
    local = logits.shape[-1]
    start = rank * local
    if start + local > vocab_size:  # padded vocabulary rows on this rank
        cols = torch.arange(start, start + local, device=logits.device)
        logits = logits.masked_fill(cols >= vocab_size, torch.finfo(logits.dtype).min / 4)
    m = logits.detach().max(dim=-1).values
    if tp > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    shifted = logits - m.unsqueeze(-1)
    exp = shifted.exp()
    lse = reduce_tp(exp.sum(dim=-1)).log()
    target = labels - start
    in_range = (target >= 0) & (target < local)
    picked = shifted.gather(-1, target.clamp(0, local - 1).unsqueeze(-1)).squeeze(-1) * in_range
    log_probs = reduce_tp(picked) - lse
    entropy = None
    if with_entropy:
        # H = lse - sum_v e^{s_v} s_v / e^{lse}: the vocabulary sum is reduced over the tensor ranks *before* it is
        # combined with lse, so every term after a reduction is the same on every rank, which is what the
        # reduction's identity backward assumes (normalising the local probabilities by the reduced sum first
        # drops the other ranks' share of the gradient through it)
        def tp_entropy(s, e, l_):
            return l_ - reduce_tp((e * s).sum(dim=-1)) / l_.exp()

        if not entropy_grad:
            entropy = tp_entropy(shifted.detach(), exp.detach(), lse.detach())
        elif entropy_grad == "checkpoint" and torch.is_grad_enabled() and shifted.requires_grad:
            # actor.entropy_checkpointing: the products over the vocabulary are recomputed in backward, not kept
            entropy = torch.utils.checkpoint.checkpoint(lambda s, l_: tp_entropy(s, s.exp(), l_), shifted, lse,
                                                        use_reentrant=False, preserve_rng_state=False)
        else:
            entropy = tp_entropy(shifted, exp, lse)
    return log_probs, entropy


def chunked_vocab_parallel_log_probs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                     vocab_size: int, *, temperature: float = 1.0, chunk_size: int = 1024,
                                     with_entropy: bool = False, entropy_grad: bool | str = True):
    """:func:`vocab_parallel_log_probs` of ``hidden @ weight.T / temperature`` for hidden states ``(..., H)`` and
    this rank's vocabulary rows ``weight`` ``(V_local, H)``, ``chunk_size`` tokens at a time (``use_fused_kernels``
    with the Megatron engine): only one chunk's ``[chunk_size, V_local]`` logits exist at a time, and under autograd
    each chunk is recomputed in backward instead of kept."""
    if chunk_size < 1:
        raise ValueError(f"fused_kernel_options chunk size {chunk_size} must be >= 1")
    lead = hidden.shape[:-1]
    flat, flat_labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    need_entropy_grad = bool(entropy_grad)  # the chunk is recomputed in backward already ("checkpoint" = True)

    def chunk(h, y):
        logits = h @ weight.t()
        if temperature != 1.0:
            logits = logits / temperature
        lp, ent = vocab_parallel_log_probs(logits, y, vocab_size, with_entropy=with_entropy,
                                           entropy_grad=need_entropy_grad)
        return lp, (ent if ent is not None else torch.zeros_like(lp))

    recompute = torch.is_grad_enabled() and (flat.requires_grad or weight.requires_grad)
    log_probs, entropies = [], []
    for start in range(0, flat.shape[0], chunk_size):
        h, y = flat[start:start + chunk_size], flat_labels[start:start + chunk_size]
        if recompute:
            lp, ent = torch.utils.checkpoint.checkpoint(chunk, h, y, use_reentrant=False, preserve_rng_state=False)
        else:
            lp, ent = chunk(h, y)
        log_probs.append(lp)
        entropies.append(ent)
    log_probs = torch.cat(log_probs).reshape(lead)
    return log_probs, (torch.cat(entropies).reshape(lead) if with_entropy else None)
