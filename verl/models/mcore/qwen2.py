"""Qwen2 (``Qwen2ForCausalLM``): a Llama-shaped decoder with biases on the q/k/v projections."""

from verl.models.mcore.convert import ArchSpec

QWEN2 = ArchSpec(name="qwen2", qkv_bias=True, refuse_keys={"use_sliding_window": False})
