"""What every checkpoint manager shares: which contents to save/load, RNG state, keeping the last N checkpoints,
and finding the latest checkpoint of a run.

Run layout (verl's): ``<default_local_dir>/global_step_<N>/{actor,critic}/`` and a tracker file
``<default_local_dir>/latest_checkpointed_iteration.txt`` holding the last complete N (written by the trainer).
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import torch
import torch.distributed as dist

from verl.utils.device import get_device_name, get_torch_device

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
TRACKER_FILE = "latest_checkpointed_iteration.txt"


def get_checkpoint_tracker_filename(root_path: str) -> str:
    return os.path.join(root_path, TRACKER_FILE)


def find_latest_ckpt_path(path: str | None, directory_format: str = "global_step_{}") -> str | None:
    """``<path>/global_step_<N>`` for the N in the tracker file, or None when there is no complete checkpoint."""
    if path is None:
        return None
    tracker = get_checkpoint_tracker_filename(path)
    if not os.path.exists(tracker):
        return None
    with open(tracker) as f:
        step = int(f.read().strip())
    ckpt = os.path.join(path, directory_format.format(step))
    return ckpt if os.path.exists(ckpt) else None


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class BaseCheckpointManager:
    """``checkpoint_config.save_contents`` / ``load_contents`` pick among model, optimizer, extra, hf_model.

    ``checkpoint_config`` is the role's typed ``checkpoint`` section (the schema's ``CheckpointConfig``: both keys,
    with their defaults) or None, which saves and loads model, optimizer and extra as verl's managers do.
    """

    def __init__(self, model, optimizer=None, lr_scheduler=None, processing_class=None, checkpoint_config=None):
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.processing_class = processing_class
        self.checkpoint_config = checkpoint_config
        if checkpoint_config is None:
            save = load = ("model", "optimizer", "extra")
        else:
            save, load = checkpoint_config.save_contents, checkpoint_config.load_contents
        self.checkpoint_save_contents = [str(c) for c in save]
        self.checkpoint_load_contents = [str(c) for c in load]
        for c in self.checkpoint_save_contents + self.checkpoint_load_contents:
            if c not in CHECKPOINT_CONTENTS:
                raise ValueError(f"checkpoint content {c!r} is not one of {list(CHECKPOINT_CONTENTS)} "
                                 "(checkpoint.save_contents / load_contents)")
        self.rank, self.world_size = _rank_world()
        self.previous_saved_paths: list[str] = []
        self.previous_global_step: int | None = None

    @property
    def should_save_model(self) -> bool:
        return "model" in self.checkpoint_save_contents

    @property
    def should_save_optimizer(self) -> bool:
        return "optimizer" in self.checkpoint_save_contents and self.optimizer is not None

    @property
    def should_save_extra(self) -> bool:
        return "extra" in self.checkpoint_save_contents

    @property
    def should_save_hf_model(self) -> bool:
        return "hf_model" in self.checkpoint_save_contents

    @property
    def should_load_model(self) -> bool:
        return "model" in self.checkpoint_load_contents

    @property
    def should_load_optimizer(self) -> bool:
        return "optimizer" in self.checkpoint_load_contents and self.optimizer is not None

    @property
    def should_load_extra(self) -> bool:
        return "extra" in self.checkpoint_load_contents

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None):
        raise NotImplementedError

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        raise NotImplementedError

    def remove_previous_save_local_path(self, paths) -> None:
        """Delete old checkpoint folders (rank 0), and their ``global_step_N`` parent once it is empty."""
        if isinstance(paths, str):
            paths = [paths]
        if self.rank != 0:
            return
        for path in paths:
            path = os.path.abspath(path)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            parent = os.path.dirname(path)
            if os.path.basename(parent).startswith("global_step_") and os.path.isdir(parent) and not os.listdir(parent):
                os.rmdir(parent)

    def _register_saved(self, local_path: str, max_ckpt_to_keep: int | None) -> None:
        local_path = os.path.abspath(local_path)
        if local_path in self.previous_saved_paths:
            self.previous_saved_paths.remove(local_path)
        self.previous_saved_paths.append(local_path)
        if max_ckpt_to_keep and max_ckpt_to_keep > 0 and len(self.previous_saved_paths) > max_ckpt_to_keep:
            old = self.previous_saved_paths[: -max_ckpt_to_keep]
            self.remove_previous_save_local_path(old)
            self.previous_saved_paths = self.previous_saved_paths[-max_ckpt_to_keep:]

    @staticmethod
    def get_rng_state() -> dict:
        state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
        if get_device_name() != "cpu":
            state[get_device_name()] = get_torch_device().get_rng_state()  # verl's key: "cuda", "npu"
        return state

    @staticmethod
    def load_rng_state(state: dict) -> None:
        torch.set_rng_state(state["cpu"])
        np.random.set_state(state["numpy"])
        random.setstate(state["random"])
        device_state = state.get(get_device_name(), state.get("device"))  # "device": older checkpoints
        if device_state is not None and get_device_name() != "cpu":
            get_torch_device().set_rng_state(device_state)
