"""Mixture-of-experts weights between the training model's layout and the checkpoint layout.

transformers 5 keeps the experts of a layer fused in two 3-D parameters (``mlp.experts.gate_up_proj`` of shape
(E, 2 I, H), gate rows first, and ``mlp.experts.down_proj`` of shape (E, H, I)), while checkpoints and vLLM's
loaders name one matrix per expert (``mlp.experts.<e>.{gate,up,down}_proj.weight``). The rollout weight push
streams the training model's tensors, so fused experts are split on the way; a rollout that holds a transformers
model (the HF rollout) takes per-expert tensors (from the Megatron engine's export) into its fused parameters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

import torch

__all__ = ["unfuse_expert_weights", "fused_expert_slot"]

_GATE_UP = "experts.gate_up_proj"
_DOWN = "experts.down_proj"
_PER_EXPERT = re.compile(r"^(?P<prefix>.*experts\.)(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


def unfuse_expert_weights(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass tensors through, splitting fused expert tensors into per-expert ``*.weight`` matrices."""
    for name, tensor in named_tensors:
        if name.endswith(_GATE_UP) and tensor.dim() == 3:
            prefix = name[: -len("gate_up_proj")]
            half = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                yield f"{prefix}{e}.gate_proj.weight", tensor[e, :half]
                yield f"{prefix}{e}.up_proj.weight", tensor[e, half:]
        elif name.endswith(_DOWN) and tensor.dim() == 3:
            prefix = name[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                yield f"{prefix}{e}.down_proj.weight", tensor[e]
        else:
            yield name, tensor


def fused_expert_slot(name: str, params: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The view of a fused expert parameter in ``params`` (name -> tensor) that the per-expert checkpoint tensor
    ``name`` fills (``...experts.<e>.gate_proj.weight`` -> ``...experts.gate_up_proj[e, :I]``, ``up`` -> its
    second half, ``down`` -> ``...experts.down_proj[e]``), or None when ``name`` is not one or has no fused home."""
    match = _PER_EXPERT.match(name)
    if match is None:
        return None
    prefix, expert, proj = match["prefix"], int(match["e"]), match["proj"]
    fused = params.get(prefix + ("down_proj" if proj == "down" else "gate_up_proj"))
    if fused is None or fused.dim() != 3 or expert >= fused.shape[0]:
        return None
    if proj == "down":
        return fused[expert]
    half = fused.shape[1] // 2
    return fused[expert, :half] if proj == "gate" else fused[expert, half:]
