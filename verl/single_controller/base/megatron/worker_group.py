"""``MegatronWorkerGroup`` (verl's group of Megatron workers): importable, not supported yet."""

from verl.single_controller.base.megatron import MEGATRON_CAPABILITY, MEGATRON_CONFIG, MEGATRON_INSTEAD
from verl.single_controller.base.worker_group import WorkerGroup
from verl.utils.unsupported import unsupported_class

__all__ = ["MegatronWorkerGroup"]

MegatronWorkerGroup = unsupported_class("MegatronWorkerGroup", MEGATRON_CAPABILITY, MEGATRON_CONFIG,
                                        MEGATRON_INSTEAD, bases=(WorkerGroup,), module=__name__)
