"""``MegatronWorker`` (verl's base class of Megatron roles): importable, not supported yet."""

from verl.single_controller.base.megatron import MEGATRON_CAPABILITY, MEGATRON_CONFIG, MEGATRON_INSTEAD
from verl.single_controller.base.worker import Worker
from verl.utils.unsupported import unsupported_class

__all__ = ["MegatronWorker"]

MegatronWorker = unsupported_class("MegatronWorker", MEGATRON_CAPABILITY, MEGATRON_CONFIG, MEGATRON_INSTEAD,
                                   bases=(Worker,), module=__name__)
