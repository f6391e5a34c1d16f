"""Helpers for the Megatron-core training engine (``verl.workers.engine.megatron``)."""
