"""Mixture-of-experts weights between the training model's layout and the checkpoint layout.

transformers 5 keeps the experts of a layer fused in two 3-D parameters (``mlp.experts.gate_up_proj`` of shape
(E, 2 I, H), gate rows first, and ``mlp.experts.down_proj`` of shape (E, H, I)), while checkpoints and vLLM's
loaders name one matrix per expert (``mlp.experts.<e>.{gate,up,down}_proj.weight``). The rollout weight push
streams the training model's tensors, so fused experts are split on the way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

__all__ = ["unfuse_expert_weights"]

_GATE_UP = "experts.gate_up_proj"
_DOWN = "experts.down_proj"


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
