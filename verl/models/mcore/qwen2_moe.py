"""Qwen2-MoE / Qwen1.5-MoE (``Qwen2MoeForCausalLM``): Qwen2's attention (biases on q/k/v) with a mixture of experts
in every layer plus a shared expert whose output is scaled by a sigmoid gate."""

from verl.models.mcore.convert import ArchSpec

QWEN2_MOE = ArchSpec(name="qwen2_moe", qkv_bias=True, experts=True, shared_expert=True,
                     refuse_keys={"qkv_bias": True, "use_sliding_window": False})
