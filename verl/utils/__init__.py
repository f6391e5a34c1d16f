"""Utilities. ``as_torch_index`` and ``group_mean_std`` (verl exports them here) load on first use, so importing
a light submodule does not pull in torch."""

import importlib

__all__ = ["as_torch_index", "group_mean_std"]


def __getattr__(name):
    if name in __all__:
        return getattr(importlib.import_module("verl.utils.groupwise"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
