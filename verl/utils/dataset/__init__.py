"""Datasets over verl-schema parquet files: RL prompts and SFT pairs / conversations.

Names are imported lazily, so light users (the preprocess scripts) do not pay for importing torch.
"""

import importlib

_EXPORTS = {
    "RLHFDataset": "rl_dataset",
    "collate_fn": "rl_dataset",
    "create_rl_dataset": "rl_dataset",
    "create_rl_sampler": "rl_dataset",
    "get_dataset_class": "rl_dataset",
    "SFTDataset": "sft_dataset",
    "MultiTurnSFTDataset": "multiturn_sft_dataset",
    "RMDataset": "rm_dataset",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
