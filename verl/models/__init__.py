"""Model definitions and weight converters used by the training engines (``mcore``: megatron-core)."""
