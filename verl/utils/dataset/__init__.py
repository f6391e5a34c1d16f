"""Datasets over verl-schema parquet files: RL prompts and SFT pairs / conversations."""

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn, create_rl_dataset, create_rl_sampler, get_dataset_class
from verl.utils.dataset.sft_dataset import SFTDataset

__all__ = [
    "MultiTurnSFTDataset",
    "RLHFDataset",
    "SFTDataset",
    "collate_fn",
    "create_rl_dataset",
    "create_rl_sampler",
    "get_dataset_class",
]
