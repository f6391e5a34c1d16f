"""CPU fallbacks for the CUDA-only calls megatron-core 0.16 makes on the model path.

megatron-core runs its models on CPU over gloo except for a few places that assume a CUDA device:

- the RNG tracker (``tensor_parallel.random``): ``model_parallel_cuda_manual_seed`` seeds CUDA generators and
  ``CudaRNGStatesTracker.fork`` swaps CUDA RNG states around dropout in tensor-parallel regions;
- ``GlobalMemoryBuffer.get_tensor`` allocates its scratch buffer (used by sequence-parallel all-gathers) on
  ``torch.cuda.current_device()``; the sequence-parallel gather / reduce-scatter helpers in
  ``tensor_parallel.mappings`` allocate their outputs the same way;
- activation recomputation (``recompute_granularity`` full / selective: ``tensor_parallel.CheckpointFunction`` and
  ``CheckpointWithoutOutput``) saves the CPU generator, the CUDA generator and the tracker's states before the
  forward and restores them around the recomputation; on CPU the same is done without the CUDA generator (the CPU
  generator and the CPU tracker above hold every random state a CPU run uses), so dropout masks replay exactly;
- the all-to-all token dispatcher of mixture-of-experts layers (``MoEAlltoAllTokenDispatcher``) copies its split
  sizes to the host on a side CUDA stream and waits for that stream; on CPU they are host tensors already, so
  the copy and the wait are nothing (the dispatcher gets a placeholder stream and a step that returns at once).

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

__all__ = ["apply_cpu_fallbacks", "CPURNGStatesTracker", "cpu_manual_seed", "define_missing_te_names"]

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
    expert_seed = (seed + 1024 + 100 * parallel_state.get_expert_model_parallel_rank()
                   + parallel_state.get_expert_tensor_parallel_rank())
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, expert_seed)


def _cpu_get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
    """``GlobalMemoryBuffer.get_tensor`` allocating in host memory."""
    required = reduce(operator.mul, tensor_shape, 1)
    buf = self.buffer.get((name, dtype))
    if buf is None or buf.numel() < required:
        buf = self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, device="cpu", requires_grad=False)
    return buf[:required].view(*tensor_shape)


def _cpu_get_all_rng_states():
    """``tensor_parallel.random._get_all_rng_states`` without a CUDA generator: (CPU state, None, tracker states)."""
    # megatron is an optional heavy dependency: imported only when the Megatron engine is used
    from megatron.core.tensor_parallel import random as mrandom

    return torch.get_rng_state(), None, mrandom.get_cuda_rng_tracker().get_states()


def _cpu_set_all_rng_states(cpu_rng_state, cuda_rng_state, cuda_rng_state_tracker):
    """``tensor_parallel.random._set_all_rng_states`` without a CUDA generator."""
    # megatron is an optional heavy dependency: imported only when the Megatron engine is used
    from megatron.core.tensor_parallel import random as mrandom

    torch.set_rng_state(cpu_rng_state)
    mrandom.get_cuda_rng_tracker().set_states(cuda_rng_state_tracker)


class _NoFP8:
    """Transformer Engine's ``FP8GlobalStateManager`` as seen without Transformer Engine: FP8 is never on."""

    @staticmethod
    def is_fp8_enabled() -> bool:
        return False

    @staticmethod
    def get_fp8_recipe():
        return None


def _no_te_context(*args, **kwargs):
    return contextlib.nullcontext()


def define_missing_te_names() -> None:
    """Names megatron-core 0.16 imports only with Transformer Engine installed but uses without it, where they raise
    NameError; defined here as what they mean without Transformer Engine (on any device: this engine never uses it):

    - the router linear (``moe_utils.RouterGatingLinearFunction``) tests ``te_general_gemm is not None``: None
      (torch's matmul path);
    - ``tensor_parallel.random.CheckpointWithoutOutput`` (selective recomputation of norms and MoE activations)
      takes ``fp8 is not None`` for "FP8 on", so it asks ``FP8GlobalStateManager`` and enters
      ``activation_recompute_forward`` / ``fp8_autocast``: FP8 off and empty contexts."""
    # megatron is an optional heavy dependency: imported only when the Megatron engine is used
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if not hasattr(mrandom, "FP8GlobalStateManager"):
        mrandom.FP8GlobalStateManager = _NoFP8
        mrandom.activation_recompute_forward = _no_te_context
        mrandom.fp8_autocast = _no_te_context


def _cpu_dtoh_and_synchronize(self, point, tokens_per_expert=None):
    """``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`` in host memory: at the same point, the all-to-all
    split sizes become the numpy arrays the CUDA path makes of them (``all_to_all_single`` takes sequences, not
    tensors); the tensors are in host memory already and there is no stream to wait for."""
    if not self.drop_and_pad and point == self.cuda_dtoh_point:
        for name in ("input_splits", "output_splits", "output_splits_tp"):
            value = getattr(self, name, None)
            if torch.is_tensor(value):
                setattr(self, name, value.numpy())
    return tokens_per_expert


def _cpu_token_dispatcher() -> None:
    # megatron is an optional heavy dependency: imported only when the Megatron engine is used
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    if MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:
        MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = "cpu"  # not None: the constructor then creates no CUDA stream
    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = _cpu_dtoh_and_synchronize


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
    # activation recomputation: CheckpointFunction / CheckpointWithoutOutput / _fork_rng look these up at call time
    mrandom._get_all_rng_states = _cpu_get_all_rng_states
    mrandom._set_all_rng_states = _cpu_set_all_rng_states
    mutils.GlobalMemoryBuffer.get_tensor = _cpu_get_tensor
    _cpu_token_dispatcher()
    if not torch.cuda.is_available():
        # megatron allocates sequence-parallel buffers with device=torch.cuda.current_device(); without CUDA
        # that call raises, so answering "cpu" only turns an error into a host allocation
        torch.cuda.current_device = lambda: "cpu"
        # dist-checkpointing synchronizes after its device-to-host copies; without CUDA there is nothing to wait for
        torch.cuda.synchronize = lambda device=None: None
    _APPLIED = True
