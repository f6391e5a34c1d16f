"""``use_torch_compile``: the decoder layers of a training model compiled with ``torch.compile``.

Each decoder layer's ``forward`` is compiled on its own (``dynamic=True``: one graph for every sequence length, no
recompilation per micro-batch). The layer's hooks -- FSDP2's gather and reshard, activation checkpointing --
stay outside the compiled function and run as before. A compilation failure is raised as an error that names the
key to turn compilation off, never a silent fall back to eager.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from verl.utils.fsdp_utils import get_fsdp_wrap_modules

try:
    from torch._dynamo.exc import TorchDynamoException
except ImportError:  # a torch build without dynamo
    TorchDynamoException = None
try:
    from torch._inductor.exc import InductorError
except ImportError:  # older torch: inductor raises dynamo's BackendCompilerFailed
    InductorError = None

__all__ = ["compile_decoder_layers", "is_compiled"]

_MARK = "_verl_compiled_forward"


def _compile_errors() -> tuple[type[BaseException], ...]:
    return tuple(e for e in (TorchDynamoException, InductorError) if e is not None)


def _guarded(compiled, key: str, layer_name: str):
    errors = _compile_errors()

    @functools.wraps(compiled)
    def forward(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except errors as exc:
            raise RuntimeError(f"{key}=True: torch.compile failed on {layer_name} ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}); set {key}=False to run the model "
                               "eagerly") from exc

    return forward


def compile_decoder_layers(model: nn.Module, key: str = "use_torch_compile") -> int:
    """Compile the ``forward`` of each decoder layer of ``model`` in place; returns how many were compiled.

    ``key`` is the config key named in errors. Raises ``ValueError`` when the model has no decoder layers to
    compile (an unknown architecture: say which layers with ``fsdp_config.wrap_policy``)."""
    layers = get_fsdp_wrap_modules(model)
    if not layers:
        raise ValueError(f"{key}=True: no decoder layers found in {type(model).__name__} (set {key}=False, or name "
                         "the layer class in fsdp_config.wrap_policy.transformer_layer_cls_to_wrap)")
    for layer in layers:
        if getattr(layer, _MARK, False):
            continue
        compiled = torch.compile(layer.forward, dynamic=True)
        layer.forward = _guarded(compiled, key, type(layer).__name__)
        setattr(layer, _MARK, True)
    return len(layers)


def is_compiled(model: nn.Module) -> bool:
    """Whether :func:`compile_decoder_layers` was applied to ``model``."""
    return any(getattr(m, _MARK, False) for m in model.modules())
