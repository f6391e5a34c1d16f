"""Utilities. ``as_torch_index`` and ``group_mean_std`` (verl exports them here), ``hf_tokenizer`` and
``hf_processor`` load on first use, so importing a light submodule does not pull in torch or transformers."""

import importlib

_EXPORTS = {"as_torch_index": "groupwise", "group_mean_std": "groupwise", "hf_tokenizer": "tokenizer",
            "hf_processor": "tokenizer"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"verl.utils.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
