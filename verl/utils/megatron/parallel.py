"""Model-parallel process groups for the Megatron engine (one grid per process, shared by its engines)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from verl.utils.device import get_device_name
from verl.utils.megatron.cpu_compat import apply_cpu_fallbacks, cpu_manual_seed, define_missing_te_names

__all__ = ["init_model_parallel", "dp_rank_and_collect"]


def init_model_parallel(tp: int, pp: int, seed: int, owner: str = "megatron", ep: int = 1,
                        etp: int | None = None) -> None:
    """Initialise megatron's tensor/pipeline/data-parallel groups (and the expert-parallel ones: ``ep`` experts
    groups, each expert cut over ``etp`` ranks, default ``tp``) over the default process group.

    Every Megatron engine of a process shares one grid: a second call with other sizes is refused, naming the
    keys that must agree (``<role>.megatron.tensor_model_parallel_size`` / ``pipeline_model_parallel_size`` /
    ``expert_model_parallel_size`` / ``expert_tensor_parallel_size``).
    """
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    if not dist.is_initialized():
        raise RuntimeError("the Megatron engine needs torch.distributed to be initialised first")
    world = dist.get_world_size()
    if world % (tp * pp) != 0:
        raise ValueError(f"{owner}.megatron: tensor_model_parallel_size * pipeline_model_parallel_size = {tp} * {pp} "
                         f"does not divide the {world} processes of this worker group")
    etp = tp if etp is None else int(etp)
    if world % (etp * ep * pp) != 0:
        raise ValueError(f"{owner}.megatron: expert_tensor_parallel_size * expert_model_parallel_size * "
                         f"pipeline_model_parallel_size = {etp} * {ep} * {pp} does not divide the {world} processes "
                         "of this worker group")
    on_cpu = get_device_name() == "cpu"
    define_missing_te_names()
    if on_cpu:
        apply_cpu_fallbacks()
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
                ps.get_expert_model_parallel_world_size(), ps.get_expert_tensor_parallel_world_size())
        if have != (tp, pp, ep, etp):
            raise ValueError(f"{owner}.megatron asks for tensor/pipeline/expert/expert-tensor parallel sizes "
                             f"{(tp, pp, ep, etp)} but engines in this process already use {have}; give every "
                             "Megatron role of one worker group the same megatron.tensor_model_parallel_size, "
                             "pipeline_model_parallel_size, expert_model_parallel_size and "
                             "expert_tensor_parallel_size")
        return
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    if on_cpu:
        cpu_manual_seed(seed)
    else:  # pragma: no cover - accelerator path, not verified on hardware
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    torch.manual_seed(seed)


def dp_rank_and_collect() -> tuple[int, bool]:
    """(data-parallel rank, whether this rank returns results for its dp group: tensor rank 0 of the last
    pipeline stage, where the outputs are computed)."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core import parallel_state as ps

    last = ps.get_pipeline_model_parallel_rank() == ps.get_pipeline_model_parallel_world_size() - 1
    return ps.get_data_parallel_rank(), last and ps.get_tensor_model_parallel_rank() == 0
