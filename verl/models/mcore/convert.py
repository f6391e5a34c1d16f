"""Shared machinery of the Hugging Face <-> megatron-core maps (the per-architecture files fill in an ArchSpec).

A megatron-core ``GPTModel`` (local layer spec, RMSNorm, SwiGLU, rotary) holds the same weights as a
Llama-shaped HF model, renamed and laid out for tensor parallelism:

======================================  ===========================================  ===================
mcore (per pipeline stage, local index)  HF (global layer index)                      tensor-parallel cut
======================================  ===========================================  ===================
embedding.word_embeddings.weight        model.embed_tokens.weight                    vocab rows (padded)
decoder.layers.i.input_layernorm        model.layers.g.input_layernorm               replicated
....self_attention.linear_qkv           self_attn.{q,k,v}_proj (weight, bias)        per query group
....self_attention.linear_proj          self_attn.o_proj                             input columns
....pre_mlp_layernorm                   post_attention_layernorm                     replicated
....mlp.linear_fc1                      mlp.{gate,up}_proj                           [gate_r; up_r] rows
....mlp.linear_fc2                      mlp.down_proj                                input columns
decoder.final_layernorm.weight          model.norm.weight                            replicated
output_layer.weight                     lm_head.weight (or score.weight: value head) vocab rows / none
======================================  ===========================================  ===================

Mixture-of-experts layers (``ArchSpec.experts``) hold, in place of ``mlp.linear_fc1`` / ``linear_fc2``, the
router ``mlp.router.weight`` (HF ``mlp.gate.weight``, replicated) and per expert ``e``
``mlp.experts.local_experts.<l>.linear_fc1`` / ``linear_fc2`` (HF ``mlp.experts.<e>.{gate,up}_proj`` /
``down_proj``; cut like ``fc1`` / ``row`` over the *expert* tensor-parallel group), where expert-parallel rank ``r``
holds experts ``r * n_local .. (r + 1) * n_local - 1`` as local ``l = e - r * n_local``. Qwen2-MoE adds a shared
expert (``mlp.shared_experts.linear_fc1`` / ``linear_fc2`` from ``mlp.shared_expert.*``, and its sigmoid gate
``mlp.shared_experts.gate_weight`` from ``mlp.shared_expert_gate.weight``); Qwen3 normalises queries and keys per
head (``self_attention.{q,k}_layernorm`` from ``self_attn.{q,k}_norm``).

``linear_qkv`` stores, for every query group, that group's query heads, then its key head, then its value
head; each tensor-parallel rank holds ``num_query_groups / tp`` whole groups. ``linear_fc1`` stores a rank's
slice of gate followed by its slice of up. The vocabulary is padded with zero rows to a multiple of the
128 (so every tensor-parallel layout shares one checkpoint shape); the engine masks the padded logits.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch
from safetensors import safe_open

__all__ = ["ArchSpec", "Rule", "padded_vocab_size", "shard", "unshard", "local_hf_pieces", "range_overlaps",
           "HFWeights", "layer_rules", "expert_rules", "model_rules", "rope_theta", "EXPERT_KINDS", "num_experts"]

# cuts of expert weights: like fc1 / row, over the expert tensor-parallel group (megatron's expert_tensor_parallel)
EXPERT_KINDS = {"xfc1": "fc1", "xrow": "row"}


@dataclass(frozen=True)
class Rule:
    """One mcore parameter and the HF tensors it is made of; ``kind`` says how it is cut over tensor ranks."""

    mcore: str
    hf: tuple[str, ...]
    kind: str  # rep | row | col | qkv | fc1 | vocab | xfc1 | xrow (experts)
    expert: int = -1  # an expert weight's global expert index; its mcore name has ``{local}`` for the local one


@dataclass(frozen=True)
class ArchSpec:
    """What differs between supported architectures. ``refuse_keys``: HF config keys whose other values the
    converter cannot represent (each names its only supported value)."""

    name: str
    qkv_bias: bool
    refuse_keys: dict = field(default_factory=dict)
    qk_norm: bool = False  # RMSNorm of each query / key head (Qwen3)
    experts: bool = False  # every decoder layer's MLP is a mixture of experts
    shared_expert: bool = False  # plus an always-on expert behind a sigmoid gate (Qwen2-MoE)
    mla: bool = False  # multi-latent attention (DeepSeek): megatron's MLATransformerConfig / MLASelfAttention

    def check(self, hf_config) -> None:
        for k, ok in self.refuse_keys.items():
            value = getattr(hf_config, k, ok)
            if value not in (ok, None):
                raise ValueError(f"{self.name}: config.{k}={value!r} is not supported by the Megatron engine "
                                 f"(only {ok!r}); use strategy=fsdp for this model")
        self.check_rope(hf_config)
        if self.experts:
            dense = list(getattr(hf_config, "mlp_only_layers", None) or [])
            step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
            if dense or step != 1:
                raise ValueError(f"{self.name}: config.mlp_only_layers={dense} / decoder_sparse_step={step}: the "
                                 "Megatron engine builds every layer as a mixture of experts (mlp_only_layers=[], "
                                 "decoder_sparse_step=1); use strategy=fsdp for this model")

    def check_rope(self, hf_config) -> None:
        rope = getattr(hf_config, "rope_scaling", None) or getattr(hf_config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if rope_type not in (None, "default"):
            raise ValueError(f"{self.name}: rope scaling {rope_type!r} is not supported by the Megatron engine; "
                             "use strategy=fsdp for this model")

    # hooks an architecture whose layers differ from the Llama-shaped ones overrides (see deepseek_v3.py)
    def is_moe_layer(self, hf_config, layer: int) -> bool:
        """Whether global decoder layer ``layer``'s MLP is a mixture of experts."""
        return self.experts

    def rules_of_layer(self, hf_config, layer: int) -> list[Rule]:
        """The parameters of global decoder layer ``layer`` (see :func:`layer_rules`)."""
        return layer_rules(self, num_experts(hf_config))

    def transformer_fields(self, hf_config) -> dict:
        """``TransformerConfig`` fields of this architecture beyond the Llama-shaped ones and the experts'."""
        return {}

    def to_mcore(self, hf_config, hf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A full HF tensor as megatron lays it out (before the tensor-parallel cut): the same by default."""
        return tensor

    def to_hf(self, hf_config, hf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`to_mcore` (after the pieces are put together)."""
        return tensor


def num_experts(hf_config) -> int:
    """The routed experts per layer of an MoE config (0 for a dense model)."""
    return int(getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None) or 0)


def rope_theta(hf_config) -> float:
    theta = getattr(hf_config, "rope_theta", None)
    if theta is None:
        params = getattr(hf_config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10000.0)
    return float(theta)


VOCAB_MULTIPLE = 128  # padded size independent of the TP size, so checkpoints reshard between layouts


def padded_vocab_size(vocab: int, tp: int) -> int:
    """The vocabulary padded to a multiple of 128 (megatron's convention); tp must divide it."""
    padded = -(vocab // -VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    if padded % tp:
        raise ValueError(f"tensor_model_parallel_size={tp} must divide the padded vocabulary ({padded})")
    return padded


def layer_rules(arch: ArchSpec, experts: int = 0) -> list[Rule]:
    """The parameters of one decoder layer (mcore suffix after ``decoder.layers.<i>.``, HF after
    ``model.layers.<g>.``); ``experts``: the routed experts of an MoE layer (all of them, by global index)."""
    attn = "self_attn."
    rules = [Rule("input_layernorm.weight", ("input_layernorm.weight",), "rep"),
             Rule("self_attention.linear_qkv.weight",
                  tuple(f"{attn}{p}_proj.weight" for p in "qkv"), "qkv")]
    if arch.qkv_bias:
        rules.append(Rule("self_attention.linear_qkv.bias", tuple(f"{attn}{p}_proj.bias" for p in "qkv"), "qkv"))
    if arch.qk_norm:
        rules += [Rule("self_attention.q_layernorm.weight", (f"{attn}q_norm.weight",), "rep"),
                  Rule("self_attention.k_layernorm.weight", (f"{attn}k_norm.weight",), "rep")]
    rules += [Rule("self_attention.linear_proj.weight", (f"{attn}o_proj.weight",), "row"),
              Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), "rep")]
    if not arch.experts:
        return rules + [Rule("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "fc1"),
                        Rule("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), "row")]
    rules.append(Rule("mlp.router.weight", ("mlp.gate.weight",), "rep"))
    rules += expert_rules(experts)
    if arch.shared_expert:
        rules += [Rule("mlp.shared_experts.linear_fc1.weight",
                       ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"), "fc1"),
                  Rule("mlp.shared_experts.linear_fc2.weight", ("mlp.shared_expert.down_proj.weight",), "row"),
                  Rule("mlp.shared_experts.gate_weight", ("mlp.shared_expert_gate.weight",), "rep")]
    return rules


def expert_rules(experts: int) -> list[Rule]:
    """The routed experts of an MoE layer (by global index; the mcore name holds ``{local}``)."""
    rules = []
    for e in range(experts):
        hf = f"mlp.experts.{e}."
        rules += [Rule("mlp.experts.local_experts.{local}.linear_fc1.weight",
                       (f"{hf}gate_proj.weight", f"{hf}up_proj.weight"), "xfc1", expert=e),
                  Rule("mlp.experts.local_experts.{local}.linear_fc2.weight", (f"{hf}down_proj.weight",), "xrow",
                       expert=e)]
    return rules


def model_rules(*, first: bool, last: bool, tied: bool, value_head: bool) -> list[Rule]:
    """The parameters outside the decoder layers held by a stage (``first``/``last`` pipeline stage)."""
    rules = []
    if first:
        rules.append(Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab"))
    if last:
        rules.append(Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "rep"))
        if value_head:
            rules += [Rule("output_layer.weight", ("score.weight",), "rep"),
                      Rule("output_layer.bias", ("score.bias",), "rep")]
        elif not tied:
            rules.append(Rule("output_layer.weight", ("lm_head.weight",), "vocab"))
        elif not first:  # tied embeddings split over stages: the last stage keeps its own copy
            rules.append(Rule("output_layer.weight", ("model.embed_tokens.weight",), "vocab"))
    return rules


@dataclass(frozen=True)
class Shapes:
    """What the cuts need to know about the model."""

    num_query_groups: int
    head_dim: int
    vocab_size: int
    padded_vocab: int


def _qkv_groups(q, k, v, groups: int, head_dim: int) -> torch.Tensor:
    rest = q.shape[1:]
    return torch.cat([q.reshape(groups, -1, *rest), k.reshape(groups, head_dim, *rest),
                      v.reshape(groups, head_dim, *rest)], dim=1)


def shard(kind: str, hf: list[torch.Tensor], rank: int, tp: int, shapes: Shapes) -> torch.Tensor:
    """This tensor rank's piece of one mcore parameter, from its full HF tensors (for an expert cut: the expert
    tensor-parallel rank and size)."""
    kind = EXPERT_KINDS.get(kind, kind)
    if kind == "rep":
        return hf[0]
    if kind == "row":
        return hf[0].chunk(tp, dim=1)[rank]
    if kind == "col":
        return hf[0].chunk(tp, dim=0)[rank]
    if kind == "vocab":
        full = hf[0]
        pad = shapes.padded_vocab - full.shape[0]
        if pad:
            full = torch.cat([full, full.new_zeros(pad, *full.shape[1:])], dim=0)
        return full.chunk(tp, dim=0)[rank]
    if kind == "fc1":
        return torch.cat([hf[0].chunk(tp, dim=0)[rank], hf[1].chunk(tp, dim=0)[rank]], dim=0)
    if kind == "qkv":
        groups = _qkv_groups(*hf, shapes.num_query_groups, shapes.head_dim)
        local = groups.chunk(tp, dim=0)[rank]
        return local.reshape(-1, *hf[0].shape[1:])
    raise ValueError(f"unknown cut {kind!r}")


def unshard(kind: str, shards: list[torch.Tensor], shapes: Shapes) -> list[torch.Tensor]:
    """The full HF tensors of one mcore parameter from every tensor rank's piece (in rank order)."""
    kind = EXPERT_KINDS.get(kind, kind)
    if kind == "rep":
        return [shards[0]]
    if kind == "row":
        return [torch.cat(shards, dim=1)]
    if kind == "col":
        return [torch.cat(shards, dim=0)]
    if kind == "vocab":
        return [torch.cat(shards, dim=0)[: shapes.vocab_size]]
    if kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return [torch.cat([h[0] for h in halves], dim=0), torch.cat([h[1] for h in halves], dim=0)]
    if kind == "qkv":
        full = torch.cat(shards, dim=0)
        rest = full.shape[1:]
        g, d = shapes.num_query_groups, shapes.head_dim
        groups = full.reshape(g, -1, *rest)
        q, k, v = groups.split([groups.shape[1] - 2 * d, d, d], dim=1)
        return [t.reshape(-1, *rest) for t in (q, k, v)]
    raise ValueError(f"unknown cut {kind!r}")


def local_hf_pieces(kind: str, local: torch.Tensor, shapes: Shapes, tp: int) -> list[torch.Tensor]:
    """A tensor rank's piece of one mcore parameter as the same rank's pieces of its HF tensors, without any
    communication: ``qkv`` -> the rank's rows of q, k and v (whole query groups); ``fc1`` -> its rows of gate and
    up; ``row`` / ``col`` / ``rep`` -> the piece itself. (``vocab`` pieces need the engine's row range: see
    :func:`range_overlaps`.) These are exactly the pieces a tensor-parallel inference engine of the same size
    holds on that rank."""
    kind = EXPERT_KINDS.get(kind, kind)
    if kind in ("rep", "row", "col", "vocab"):
        return [local]
    if kind == "fc1":
        return list(local.chunk(2, dim=0))
    if kind == "qkv":
        rest = local.shape[1:]
        d = shapes.head_dim
        groups = local.reshape(shapes.num_query_groups // tp, -1, *rest)
        q, k, v = groups.split([groups.shape[1] - 2 * d, d, d], dim=1)
        return [t.reshape(-1, *rest) for t in (q, k, v)]
    raise ValueError(f"unknown cut {kind!r}")


def range_overlaps(have: list[tuple[int, int]], want: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """``out[s][r]`` = the rows ``[a, b)`` that rank ``s`` holds (``have[s]``) and rank ``r`` wants (``want[r]``),
    empty ``(a, a)`` when none: the send plan of a row regroup (each rank sends only what another lacks)."""
    out = []
    for lo, hi in have:
        row = []
        for a, b in want:
            start, stop = max(lo, a), min(hi, b)
            row.append((start, max(start, stop)))
        out.append(row)
    return out


class HFWeights:
    """Reads single tensors from a Hugging Face safetensors checkpoint (one file or an index), lazily."""

    def __init__(self, model_dir: str):
        self._open = safe_open
        self.model_dir = model_dir
        index = os.path.join(model_dir, "model.safetensors.index.json")
        single = os.path.join(model_dir, "model.safetensors")
        if os.path.exists(index):
            with open(index) as f:
                self.files = {name: os.path.join(model_dir, fn) for name, fn in json.load(f)["weight_map"].items()}
        elif os.path.exists(single):
            with safe_open(single, "pt") as f:
                self.files = {name: single for name in f.keys()}
        else:
            raise FileNotFoundError(f"{model_dir}: no model.safetensors or model.safetensors.index.json; the "
                                    "Megatron engine loads safetensors checkpoints (save the model with "
                                    "save_pretrained(safe_serialization=True))")

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> torch.Tensor:
        if name not in self.files:
            raise KeyError(f"{self.model_dir}: the checkpoint has no tensor {name!r}")
        with self._open(self.files[name], "pt") as f:
            return f.get_tensor(name)
