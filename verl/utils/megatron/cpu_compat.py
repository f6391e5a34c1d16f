"""CPU fallbacks for the two CUDA-only calls megatron-core 0.16 makes on the model path.

megatron-core runs its models on CPU over gloo except for two places that assume a CUDA device:

- the RNG tracker (``tensor_parallel.random``): ``model_parallel_cuda_manual_seed`` seeds CUDA generators and
  ``CudaRNGStatesTracker.fork`` swaps CUDA RNG states around dropout in tensor-parallel regions;
- ``GlobalMemoryBuffer.get_tensor`` allocates its scratch buffer (used by sequence-parallel all-gathers) on
  ``torch.cuda.current_device()``; the sequence-parallel gather / reduce-scatter helpers in
  ``tensor_parallel.mappings`` allocate their outputs the same way.

:func:`apply_cpu_fallbacks` swaps in a tracker that keeps CPU generator states and a buffer that allocates in
host memory, and -- on a torch build without CUDA only, where these calls could only raise -- makes
``torch.cuda.current_device()`` answer ``"cpu"`` so those allocations land in host memory and
``torch.cuda.synchronize()`` (called by dist-checkpointing after its copies to host memory) a no-op. It is applied only
when no accelerator is used, and is idempotent.
"""

from __future__ import annotations

import contextlib
import operator
from functools import reduce

import torch

__all__ = ["apply_cpu_fallbacks", "CPURNGStatesTracker", "cpu_manual_seed"]

_APPLIED = False


class CPURNGStatesTracker:
    """The CPU counterpart of megatron's ``CudaRNGStatesTracker``: named CPU generator states, forked around
    the regions megatron runs under ``get_cuda_rng_tracker().fork(name)`` (dropout in tensor-parallel regions)."""

    def __init__(self, *args, **kwargs):
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()
        self._current_state_name = "default-rng"

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def reset(self) -> None:
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return {name: state.clone() for name, state in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = {name: state.clone() for name, state in states.items()}

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists in the CPU RNG tracker")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} already exists in the CPU RNG tracker")
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(int(seed)).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise KeyError(f"RNG state {name!r} was not added to the CPU RNG tracker")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


def cpu_manual_seed(seed: int) -> None:
    """``model_parallel_cuda_manual_seed`` on CPU: seed the default generator with ``seed`` and register the
    tensor-parallel (``seed + 2718 + tp_rank``) and expert-parallel states with the CPU tracker."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    apply_cpu_fallbacks()
    tracker = mrandom._CUDA_RNG_STATE_TRACKER
    tracker.reset()
    torch.manual_seed(seed)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * tp_rank + 1)


def _cpu_get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
    """``GlobalMemoryBuffer.get_tensor`` allocating in host memory."""
    required = reduce(operator.mul, tensor_shape, 1)
    buf = self.buffer.get((name, dtype))
    if buf is None or buf.numel() < required:
        buf = self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, device="cpu", requires_grad=False)
    return buf[:required].view(*tensor_shape)


def apply_cpu_fallbacks() -> None:
    """Install the CPU RNG tracker and host-memory buffer (call before building a model on CPU)."""
    global _APPLIED
    if _APPLIED:
        return
    # megatron is an optional heavy dependency: imported only when the Megatron engine is used
    from megatron.core import utils as mutils
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._CUDA_RNG_STATE_TRACKER = CPURNGStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mutils.GlobalMemoryBuffer.get_tensor = _cpu_get_tensor
    if not torch.cuda.is_available():
        # megatron allocates sequence-parallel buffers with device=torch.cuda.current_device(); without CUDA
        # that call raises, so answering "cpu" only turns an error into a host allocation
        torch.cuda.current_device = lambda: "cpu"
        # dist-checkpointing synchronizes after its device-to-host copies; without CUDA there is nothing to wait for
        torch.cuda.synchronize = lambda device=None: None
    _APPLIED = True
