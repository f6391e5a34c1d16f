"""Llama (``LlamaForCausalLM``): RMSNorm, rotary embeddings, SwiGLU MLP, no biases."""

from verl.models.mcore.convert import ArchSpec

LLAMA = ArchSpec(name="llama", qkv_bias=False, refuse_keys={"attention_bias": False, "mlp_bias": False})
