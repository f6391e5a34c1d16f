"""``NVMegatronRayWorkerGroup`` (verl's Ray group of Megatron workers): importable, not supported yet."""

from verl.single_controller.base.megatron import MEGATRON_CAPABILITY, MEGATRON_CONFIG, MEGATRON_INSTEAD
from verl.single_controller.ray.base import RayWorkerGroup
from verl.utils.unsupported import unsupported_class

__all__ = ["NVMegatronRayWorkerGroup"]

NVMegatronRayWorkerGroup = unsupported_class("NVMegatronRayWorkerGroup", MEGATRON_CAPABILITY, MEGATRON_CONFIG,
                                             MEGATRON_INSTEAD, bases=(RayWorkerGroup,), module=__name__)
