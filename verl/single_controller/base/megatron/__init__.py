"""verl's Megatron worker base classes. Megatron training is not supported yet: the names import, and building
one raises NotImplementedError naming the capability (see :mod:`verl.utils.unsupported`)."""

MEGATRON_CAPABILITY = "Megatron training (megatron-core workers)"
MEGATRON_CONFIG = "actor_rollout_ref.actor.strategy=megatron / critic.strategy=megatron"
MEGATRON_INSTEAD = "strategy=fsdp (or fsdp2)"
