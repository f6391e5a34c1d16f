"""The one device seam: every cuda / npu / cpu difference in the code base goes through here.

Nothing else in ``verl`` should branch on the accelerator type. Callers ask this module for
the device name, the torch device module, the collective backend, the Ray resource name and
the visible-devices environment variable.

``VERL_DEVICE`` (cuda|npu|cpu) forces a choice; otherwise the first available of cuda, npu,
cpu is used. NPU support goes through ``torch_npu`` and ``hccl`` and is not verified on
hardware (our machines are CPU-only).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

_VALID = ("cuda", "npu", "cpu")


@functools.lru_cache(maxsize=None)
def is_torch_npu_available() -> bool:
    try:
        # optional heavy dependency: only Ascend machines have torch_npu; importing it registers torch.npu
        import torch_npu  # noqa: F401

        return hasattr(torch, "npu") and torch.npu.is_available()
    except Exception:
        return False


def is_cuda_available() -> bool:
    return torch.cuda.is_available()


def is_npu_available() -> bool:
    return is_torch_npu_available()


@dataclass(frozen=True)
class DeviceSpec:
    name: str  # "cuda" | "npu" | "cpu"
    dist_backend: str  # "nccl" | "hccl" | "gloo"
    ray_resource: str | None  # "GPU" | "NPU" | None (CPU processes only need CPU slots)
    visible_devices_env: str | None  # CUDA_VISIBLE_DEVICES | ASCEND_RT_VISIBLE_DEVICES | None


_SPECS = {
    "cuda": DeviceSpec("cuda", "nccl", "GPU", "CUDA_VISIBLE_DEVICES"),
    "npu": DeviceSpec("npu", "hccl", "NPU", "ASCEND_RT_VISIBLE_DEVICES"),
    "cpu": DeviceSpec("cpu", "gloo", None, None),
}


def resolve_device(device: str | None = "auto") -> str:
    """Turn a user's ``trainer.device`` value (auto|cuda|npu|cpu) into a concrete device name.

    Raises ValueError naming the value and what would work.
    """
    device = (device or "auto").lower()
    if device == "auto":
        forced = os.environ.get("VERL_DEVICE")
        if forced:
            return resolve_device(forced)
        if is_cuda_available():
            return "cuda"
        if is_npu_available():
            return "npu"
        return "cpu"
    if device not in _VALID:
        raise ValueError(f"trainer.device={device!r} is not one of auto, cuda, npu, cpu")
    if device == "cuda" and not is_cuda_available():
        raise ValueError("trainer.device=cuda but torch sees no CUDA GPU here; use trainer.device=auto or cpu")
    if device == "npu" and not is_npu_available():
        raise ValueError("trainer.device=npu but torch_npu sees no Ascend NPU here; use trainer.device=auto or cpu")
    return device


def get_device_spec(device: str | None = None) -> DeviceSpec:
    return _SPECS[resolve_device(device or "auto")]


def get_device_name() -> str:
    """'cuda', 'npu' or 'cpu' for this process."""
    return resolve_device("auto")


def get_torch_device():
    """The torch device module (torch.cuda, torch.npu) or a CPU stand-in with the same few methods."""
    name = get_device_name()
    if name == "cuda":
        return torch.cuda
    if name == "npu":
        return torch.npu
    return _CpuDeviceModule


def get_device_id() -> int:
    name = get_device_name()
    return 0 if name == "cpu" else get_torch_device().current_device()


def get_device(local_rank: int | None = None) -> torch.device:
    name = get_device_name()
    if name == "cpu":
        return torch.device("cpu")
    if local_rank is None:
        local_rank = get_torch_device().current_device()
    return torch.device(name, local_rank)


def get_dist_backend(device: str | None = None) -> str:
    return get_device_spec(device).dist_backend


def get_nccl_backend() -> str:  # verl's name for the same question
    return get_dist_backend()


def get_ray_resource_name(device: str | None = None) -> str | None:
    return get_device_spec(device).ray_resource


def get_visible_devices_env(device: str | None = None) -> str | None:
    return get_device_spec(device).visible_devices_env


def set_device(local_rank: int) -> None:
    """Bind this process to its accelerator (no-op on CPU)."""
    if get_device_name() != "cpu":
        get_torch_device().set_device(local_rank)


def device_count() -> int:
    name = get_device_name()
    if name == "cpu":
        return 0
    return get_torch_device().device_count()


def synchronize() -> None:
    if get_device_name() != "cpu":
        get_torch_device().synchronize()


def empty_cache() -> None:
    if get_device_name() != "cpu":
        get_torch_device().empty_cache()


def max_memory_allocated_gb() -> float:
    if get_device_name() == "cpu":
        return 0.0
    return get_torch_device().max_memory_allocated() / 1024**3


def reset_peak_memory_stats() -> None:
    """Start a new accelerator memory peak (:func:`max_memory_allocated_gb` then reports from here); CPU: nothing."""
    if get_device_name() != "cpu":
        get_torch_device().reset_peak_memory_stats()


def torch_profiler_activities() -> list:
    """What a torch profiler records here: host ops always, plus CUDA kernels on a CUDA device."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if get_device_name() == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def module_device(module) -> torch.device:
    """Where ``module``'s parameters live (FSDP2 DTensor parameters report their local device); CPU if none."""
    for param in module.parameters():
        return param.device
    return torch.device("cpu")


def collective_device(group=None) -> torch.device:
    """The device a tensor must be on for a collective of ``group``: CPU for gloo, the current accelerator for
    nccl/hccl (which reject CPU tensors)."""
    backend = dist.get_backend(group) if dist.is_available() and dist.is_initialized() else "gloo"
    if backend == "gloo":
        return torch.device("cpu")
    return torch.device(get_device_name(), get_torch_device().current_device())


# oneDNN ISA caps (``ONEDNN_MAX_CPU_ISA``, older name ``DNNL_MAX_CPU_ISA``) below the bf16 dot-product
# instructions: with one of these oneDNN, which runs torch's bf16 matmuls on CPU, emulates bf16
_ONEDNN_CAPS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def onednn_isa_cap() -> str | None:
    """The oneDNN ISA cap set in the environment (upper case), if any."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(name, "").strip().upper()
        if value:
            return value
    return None


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX-512 BF16 or AMX). Without them torch emulates bf16
    and it is far slower than fp32: on our AVX2-only EPYC hosts a 2048^2 bf16 matmul took 60 s vs 0.12 s in
    fp32, and a 1M-parameter Qwen2 forward+backward 17x longer; on AVX-512-BF16 hosts bf16 is ~4x faster.
    A oneDNN ISA cap below bf16 (``ONEDNN_MAX_CPU_ISA=AVX2``) counts as no native bf16: oneDNN then emulates it
    (measured on an AVX-512-BF16 host: a 1024^2 bf16 matmul 6 ms uncapped, 2 s capped at AVX2)."""
    if onednn_isa_cap() in _ONEDNN_CAPS_WITHOUT_BF16:
        return False
    probe = getattr(torch, "cpu", None)
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        fn = getattr(probe, name, None)
        try:
            if fn is not None and fn():
                return True
        except Exception:  # private probes: treat a failure as "unknown = not native"
            pass
    return False


class _CpuDeviceModule:
    """Just enough of the torch.cuda surface for device-agnostic callers on CPU."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def synchronize() -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_rng_state():
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def max_memory_allocated() -> int:
        return 0

    @staticmethod
    def memory_allocated() -> int:
        return 0

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 0
