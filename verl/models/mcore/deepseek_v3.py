"""DeepSeek-V3 and Moonlight (``DeepseekV3ForCausalLM``): multi-latent attention and DeepSeek's mixture of experts.

**Attention (MLA).** Queries come from a low-rank path ``q_a_proj`` -> RMSNorm ``q_a_layernorm`` -> ``q_b_proj``
(or one ``q_proj`` when ``q_lora_rank`` is None); keys and values from one compressed latent: ``kv_a_proj_with_mqa``
gives ``kv_lora_rank`` latent features (normalised by ``kv_a_layernorm``, then expanded per head by ``kv_b_proj``
into ``qk_nope_head_dim`` key and ``v_head_dim`` value features) plus ``qk_rope_head_dim`` rotary key features shared
by all heads. Each query / key head is its ``nope`` part followed by its rotary part. megatron-core's
``MLASelfAttention`` (``MLATransformerConfig``; local spec, with the replacements of :func:`mla_submodules`: the down
projections replicated, the up projections column-parallel, cut by heads) computes the same.

======================================  =============================================  ==========================
mcore (``decoder.layers.i.``)           HF (``model.layers.g.``)                       tensor-parallel cut
======================================  =============================================  ==========================
self_attention.linear_q_down_proj       self_attn.q_a_proj                             replicated
self_attention.q_layernorm              self_attn.q_a_layernorm                        replicated
self_attention.linear_q_up_proj         self_attn.q_b_proj                             rows (by head)
self_attention.linear_q_proj            self_attn.q_proj (``q_lora_rank`` None)         rows (by head)
self_attention.linear_kv_down_proj      self_attn.kv_a_proj_with_mqa                   replicated
self_attention.kv_layernorm             self_attn.kv_a_layernorm                       replicated
self_attention.linear_kv_up_proj        self_attn.kv_b_proj                            rows (by head)
self_attention.linear_proj              self_attn.o_proj                               input columns
mlp.router.weight                       mlp.gate.weight                                replicated
mlp.router.expert_bias (a buffer)       mlp.gate.e_score_correction_bias (fp32)        replicated
mlp.shared_experts.linear_fc1 / fc2     mlp.shared_experts.{gate,up}_proj / down_proj  [gate_r; up_r] / columns
======================================  =============================================  ==========================

The routed experts and the dense layers' MLP are named and cut as in ``convert.py``.

**Rotary embedding.** With ``rope_interleave`` (HF's default, and what DeepSeek's own modelling code always does)
HF rotates the rotary features as interleaved pairs ``(x0, x1), (x2, x3), ...`` and returns them de-interleaved
(evens, then odds); megatron's MLA de-interleaves the same way before its rotation, so the weights load as they are.
With ``rope_interleave=False`` HF rotates halves (``rotate_half``); the rotary rows of ``q_proj`` / ``q_b_proj`` (per
head) and ``kv_a_proj_with_mqa`` are then interleaved on load (HF row ``i`` -> ``2 i``, ``i + d/2`` -> ``2 i + 1``)
so megatron's de-interleaving restores HF's order, and put back on export. ``rope_scaling`` ``yarn`` maps to
megatron's ``rope_type="yarn"`` (``factor``, ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``,
``mscale``, ``mscale_all_dim``): the same frequencies, the same ``mscale`` on cos / sin and the softmax scale times
``mscale(factor, mscale_all_dim)**2``; other scaling types, or yarn values whose cos / sin factor megatron computes
differently, are refused naming the field.

**Experts.** Layers ``first_k_dense_replace`` and up are a mixture of experts (megatron's ``moe_layer_freq`` list),
the first ones a dense SwiGLU MLP. The router scores are ``sigmoid(logits)`` (logits in fp32, as HF); the
experts are chosen by ``score + e_score_correction_bias`` (megatron's ``expert_bias`` buffer), limited to the best
``topk_group`` of ``n_group`` groups (a group's score is the sum of its best two), and weighted by the plain scores
renormalised over the k (``norm_topk_prob``) times ``routed_scaling_factor``. ``n_shared_experts`` always-on experts
(no gate) form one MLP of ``n_shared_experts * moe_intermediate_size``. The correction bias is a fixed buffer, as in
HF (this engine does not apply megatron's aux-loss-free bias update). megatron scores a group by its best
``num_experts_per_tok // topk_group`` experts, so group-limited routing is accepted where that is two (DeepSeek-V3:
8 // 4); megatron always renormalises sigmoid scores, so ``norm_topk_prob=False`` is refused (unless top-1).

Multi-token-prediction layers (``num_nextn_predict_layers``: ``model.layers.<num_hidden_layers + j>.*`` in the
checkpoint) are not built: their weights are not read and not exported, as verl does without ``mtp``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from verl.models.mcore.convert import ArchSpec, Rule, expert_rules, num_experts, rope_theta

__all__ = ["DEEPSEEK_V3", "DeepseekV3Spec", "mla_submodules"]

_A, _M = "self_attn.", "self_attention."


def _rope_dict(hf_config) -> dict:
    rope = getattr(hf_config, "rope_scaling", None) or getattr(hf_config, "rope_parameters", None) or {}
    return dict(rope) if isinstance(rope, dict) else {}


def _rope_type(rope: dict) -> str:
    return rope.get("rope_type", rope.get("type")) or "default"


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(hf_config) -> dict:
    """megatron's yarn fields for HF's ``rope_scaling`` (HF's defaults where a key is missing)."""
    rope = _rope_dict(hf_config)
    original = int(rope.get("original_max_position_embeddings") or hf_config.max_position_embeddings)
    factor = rope.get("factor")
    factor = float(factor) if factor is not None else hf_config.max_position_embeddings / original
    return dict(rotary_scaling_factor=factor, original_max_position_embeddings=original,
                beta_fast=float(rope.get("beta_fast") or 32), beta_slow=float(rope.get("beta_slow") or 1),
                mscale=float(rope.get("mscale") if rope.get("mscale") is not None else 1.0),
                mscale_all_dim=float(rope.get("mscale_all_dim") or 0.0))


@functools.cache
def mla_submodules() -> dict:
    """What the local spec's ``MLASelfAttention`` needs in place of its defaults on this engine:

    - ``core_attention``: megatron's local ``DotProductAttention`` taking the key / value head sizes MLA passes
      (``k_channels`` / ``v_channels``, which only Transformer Engine's attention takes); it works with query / key
      heads of one size and value heads of another as it is (its output size comes from ``kv_channels``, which
      :meth:`DeepseekV3Spec.transformer_fields` sets to ``v_head_dim``; the softmax scale is MLA's);
    - ``linear_q_down_proj`` / ``linear_kv_down_proj``: megatron's replicated local ``Linear`` (as Transformer
      Engine's spec replicates them). With the local spec's column-parallel down projections megatron gathers the
      rotary key features over the tensor ranks, and the backward of that gather keeps each rank's own slice of
      the gradient: a rank's gradient of the shared rotary key then holds only its own heads' part. Replicated, the
      rotary key is gathered over the sequence instead (its gradient summed over the ranks), and the weights, which
      see this rank's slice of the sequence, are marked ``sequence_parallel`` (gradient summed by the engine)."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only with strategy=megatron
    from megatron.core.extensions import transformer_engine as te_ext
    from megatron.core.post_training.modelopt.layers import Linear
    from megatron.core.transformer import multi_latent_attention as mla
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    if not te_ext.HAVE_TE:
        # without Transformer Engine megatron's TE module imports with mock classes, so MLA believes it has TE and
        # asks isinstance(layer, <mock>); nothing here is a TE layer
        class _NoTELayer:
            pass

        mla.HAVE_TE = False
        for name in ("TELinear", "TEColumnParallelLinear"):
            if not isinstance(getattr(mla, name, None), type):
                setattr(mla, name, _NoTELayer)
    mla.Linear = Linear  # the class MLA accepts as a replicated down projection (None where its import failed)

    class MLADotProductAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            super().__init__(*args, **kwargs)

    return {"core_attention": MLADotProductAttention, "linear_q_down_proj": Linear, "linear_kv_down_proj": Linear}


def _interleave_index(d: int) -> torch.Tensor:
    """Row order that puts HF's halves ``[0, d/2)`` and ``[d/2, d)`` in alternate rows."""
    return torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).reshape(-1)


@dataclass(frozen=True)
class DeepseekV3Spec(ArchSpec):
    """DeepSeek-V3's conversion: multi-latent attention, leading dense layers, DeepSeek's experts (module doc)."""

    def check(self, hf_config) -> None:
        super().check(hf_config)
        topk, experts = int(hf_config.num_experts_per_tok), num_experts(hf_config)
        if topk > 1 and not getattr(hf_config, "norm_topk_prob", True):
            raise ValueError(f"{self.name}: config.norm_topk_prob=False with num_experts_per_tok={topk}: "
                             "megatron-core renormalises the sigmoid router scores over the chosen experts; the "
                             "Megatron engine supports norm_topk_prob=True (use strategy=fsdp for this model)")
        if int(getattr(hf_config, "n_shared_experts", 0) or 0) < 1:
            raise ValueError(f"{self.name}: config.n_shared_experts={hf_config.n_shared_experts!r}: the Megatron "
                             "engine builds DeepSeek's layers with at least one shared expert; use strategy=fsdp")
        # DeepSeek's own config.json names its router; HF's DeepseekV3 (and this engine) always route this way, so a
        # checkpoint naming another (DeepSeek-V2's softmax / greedy) would run differently in vLLM
        for key, ok in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
            if getattr(hf_config, key, ok) not in (ok, None):
                raise ValueError(f"{self.name}: config.{key}={getattr(hf_config, key)!r}: DeepseekV3ForCausalLM routes "
                                 f"with {key}={ok!r} (HF's modelling ignores the key, vLLM follows it); use "
                                 f"{key}={ok!r} or strategy=fsdp")
        groups, chosen = self.groups(hf_config)
        if groups and experts % groups:
            raise ValueError(f"{self.name}: config.n_group={groups} must divide the {experts} routed experts")
        if groups and topk // chosen != 2:
            raise ValueError(f"{self.name}: config.num_experts_per_tok={topk} with topk_group={chosen}: HF scores an "
                             "expert group by its best 2 experts, megatron-core by its best num_experts_per_tok // "
                             "topk_group; the Megatron engine supports group-limited routing where that is 2 (or "
                             "n_group=1); use strategy=fsdp for this model")
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if not getattr(hf_config, key, None):
                raise ValueError(f"{self.name}: config.{key} is missing; a DeepseekV3 config.json names it")

    @staticmethod
    def groups(hf_config) -> tuple[int, int]:
        """(n_group, topk_group) when routing is group-limited, else (0, 0) (one group, or every group chosen)."""
        groups = int(getattr(hf_config, "n_group", None) or 1)
        chosen = int(getattr(hf_config, "topk_group", None) or groups)
        return (groups, chosen) if 1 < groups and chosen < groups else (0, 0)

    def check_rope(self, hf_config) -> None:
        rope = _rope_dict(hf_config)
        kind = _rope_type(rope)
        if kind == "default":
            return
        if kind != "yarn":
            raise ValueError(f"{self.name}: config.rope_scaling type {kind!r} is not supported by the Megatron "
                             "engine (megatron's multi-latent attention has rope and yarn); use strategy=fsdp")
        y = _yarn(hf_config)
        factor, mscale, mscale_all = y["rotary_scaling_factor"], rope.get("mscale"), rope.get("mscale_all_dim")
        # HF's cos / sin factor; megatron's: mscale(factor, mscale) / mscale(factor, mscale_all_dim)
        hf = rope.get("attention_factor")
        if hf is None:
            hf = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)) if mscale and mscale_all \
                else _yarn_mscale(factor)
        mine = _yarn_mscale(factor, y["mscale"]) / _yarn_mscale(factor, y["mscale_all_dim"])
        if abs(float(hf) - mine) > 1e-12 * max(1.0, abs(mine)):
            raise ValueError(f"{self.name}: config.rope_scaling (yarn) mscale={mscale!r} / mscale_all_dim="
                             f"{mscale_all!r} / attention_factor={rope.get('attention_factor')!r}: HF scales cos / "
                             f"sin by {float(hf):.6g}, megatron's yarn by {mine:.6g}; set mscale and mscale_all_dim "
                             "(as DeepSeek-V3's config does) or use strategy=fsdp")
        if rope.get("truncate", True) is False:
            raise ValueError(f"{self.name}: config.rope_scaling.truncate=False is not supported by megatron's yarn "
                             "(it rounds the correction range); use strategy=fsdp for this model")

    def is_moe_layer(self, hf_config, layer: int) -> bool:
        return layer >= int(getattr(hf_config, "first_k_dense_replace", 0) or 0)

    def rules_of_layer(self, hf_config, layer: int) -> list[Rule]:
        rules = [Rule("input_layernorm.weight", ("input_layernorm.weight",), "rep")]
        if hf_config.q_lora_rank is None:
            rules.append(Rule(f"{_M}linear_q_proj.weight", (f"{_A}q_proj.weight",), "col"))
        else:
            rules += [Rule(f"{_M}linear_q_down_proj.weight", (f"{_A}q_a_proj.weight",), "rep"),
                      Rule(f"{_M}q_layernorm.weight", (f"{_A}q_a_layernorm.weight",), "rep"),
                      Rule(f"{_M}linear_q_up_proj.weight", (f"{_A}q_b_proj.weight",), "col")]
        rules += [Rule(f"{_M}linear_kv_down_proj.weight", (f"{_A}kv_a_proj_with_mqa.weight",), "rep"),
                  Rule(f"{_M}kv_layernorm.weight", (f"{_A}kv_a_layernorm.weight",), "rep"),
                  Rule(f"{_M}linear_kv_up_proj.weight", (f"{_A}kv_b_proj.weight",), "col"),
                  Rule(f"{_M}linear_proj.weight", (f"{_A}o_proj.weight",), "row"),
                  Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "rep")]
        if not self.is_moe_layer(hf_config, layer):
            return rules + [Rule("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "fc1"),
                            Rule("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "row")]
        rules += [Rule("mlp.router.weight", ("mlp.gate.weight",), "rep"),
                  Rule("mlp.router.expert_bias", ("mlp.gate.e_score_correction_bias",), "rep")]
        rules += expert_rules(num_experts(hf_config))
        return rules + [Rule("mlp.shared_experts.linear_fc1.weight",
                             ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"), "fc1"),
                        Rule("mlp.shared_experts.linear_fc2.weight", ("mlp.shared_experts.down_proj.weight",), "row")]

    def transformer_fields(self, hf_config) -> dict:
        first_dense = int(getattr(hf_config, "first_k_dense_replace", 0) or 0)
        layers = int(hf_config.num_hidden_layers)
        groups, chosen = self.groups(hf_config)
        fields = dict(
            multi_latent_attention=True, q_lora_rank=hf_config.q_lora_rank, kv_lora_rank=int(hf_config.kv_lora_rank),
            qk_head_dim=int(hf_config.qk_nope_head_dim), qk_pos_emb_head_dim=int(hf_config.qk_rope_head_dim),
            v_head_dim=int(hf_config.v_head_dim), kv_channels=int(hf_config.v_head_dim),
            rotary_base=rope_theta(hf_config), rope_type="rope", rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0,
            moe_layer_freq=[0 if g < first_dense else 1 for g in range(layers)],
            moe_router_score_function="sigmoid", moe_router_pre_softmax=False, moe_router_enable_expert_bias=True,
            moe_router_topk_scaling_factor=float(getattr(hf_config, "routed_scaling_factor", 1.0) or 1.0),
            moe_router_num_groups=groups or None, moe_router_group_topk=chosen or None, moe_router_dtype="fp32",
            moe_shared_expert_intermediate_size=int(hf_config.moe_intermediate_size) * int(hf_config.n_shared_experts),
            moe_shared_expert_gate=False,
        )
        if _rope_type(_rope_dict(hf_config)) == "yarn":
            fields.update(rope_type="yarn", **_yarn(hf_config))
        return fields

    # rope_interleave=False: HF's rotary halves laid out as the interleaved pairs megatron de-interleaves
    def _rotary_rows(self, hf_config, hf_name: str, rows: int) -> tuple[int, int, int] | None:
        """(blocks, block size, offset of the rotary rows in a block) of a tensor holding rotary rows, else None."""
        if getattr(hf_config, "rope_interleave", True):
            return None
        d = int(hf_config.qk_rope_head_dim)
        if hf_name.endswith((f"{_A}q_proj.weight", f"{_A}q_b_proj.weight")):
            per_head = int(hf_config.qk_nope_head_dim) + d
            return rows // per_head, per_head, int(hf_config.qk_nope_head_dim)
        if hf_name.endswith(f"{_A}kv_a_proj_with_mqa.weight"):
            return 1, rows, int(hf_config.kv_lora_rank)
        return None

    def _permute(self, hf_config, hf_name: str, tensor: torch.Tensor, inverse: bool) -> torch.Tensor:
        where = self._rotary_rows(hf_config, hf_name, tensor.shape[0])
        if where is None:
            return tensor
        blocks, size, start = where
        index = _interleave_index(int(hf_config.qk_rope_head_dim))
        if inverse:
            index = torch.argsort(index)
        out = tensor.reshape(blocks, size, *tensor.shape[1:]).clone()
        out[:, start:] = out[:, start:][:, index]
        return out.reshape(tensor.shape)

    def to_mcore(self, hf_config, hf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        return self._permute(hf_config, hf_name, tensor, inverse=False)

    def to_hf(self, hf_config, hf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        return self._permute(hf_config, hf_name, tensor, inverse=True)


DEEPSEEK_V3 = DeepseekV3Spec(name="deepseek_v3", qkv_bias=False, experts=True, mla=True,
                             refuse_keys={"attention_bias": False})
