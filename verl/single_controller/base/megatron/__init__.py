"""verl's Megatron worker base classes. Megatron training itself runs through ``strategy=megatron``
(``verl.workers.megatron_workers``, which build on ``Worker``); these base classes for user-written Megatron
workers are not supported yet: the names import, and building one raises NotImplementedError naming the
capability (see :mod:`verl.utils.unsupported`)."""

MEGATRON_CAPABILITY = "the Megatron worker base classes for user-written Megatron workers"
MEGATRON_CONFIG = None
MEGATRON_INSTEAD = ("actor_rollout_ref.actor.strategy=megatron (verl.workers.megatron_workers), or subclass "
                    "verl.single_controller.base.Worker with verl.single_controller.base.decorator."
                    "make_nd_compute_dataproto_dispatch_fn for Megatron's data-parallel dispatch")
