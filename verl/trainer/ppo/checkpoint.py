"""Driver-side checkpoint bookkeeping: the folder layout, the "latest" marker and retention.

Layout under ``trainer.default_local_dir``::

    global_step_N/actor/            written by the actor workers (save_checkpoint)
    global_step_N/critic/           written by the critic workers
    global_step_N/data.pt           the train dataloader's state_dict
    global_step_N/trainer_state.pt  the driver's own state (KL controller, metric history for the plot)
    latest_checkpointed_iteration.txt   "N", written last and atomically (tmp file + os.replace)

A crash while saving leaves the previous marker in place, so resume never sees a half-written step.
"""

from __future__ import annotations

import os
import re
import shutil

import torch

from verl.protocol import WorkerError
from verl.utils.fs import atomic_write_text

__all__ = ["LATEST_FILE", "step_folder", "find_latest_ckpt_path", "mark_latest", "prune_checkpoints",
           "list_step_folders", "stopped_run_error", "CheckpointMixin"]

LATEST_FILE = "latest_checkpointed_iteration.txt"
_STEP_RE = re.compile(r"^global_step_(\d+)$")


def step_folder(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def find_latest_ckpt_path(root: str) -> str | None:
    """``root/global_step_N`` named by the marker file, or None when there is no complete checkpoint."""
    if root is None:
        return None
    marker = os.path.join(root, LATEST_FILE)
    if not os.path.exists(marker):
        return None
    with open(marker) as f:
        text = f.read().strip()
    if not text.isdigit():
        return None
    path = step_folder(root, int(text))
    return path if os.path.isdir(path) else None


def mark_latest(root: str, step: int) -> None:
    atomic_write_text(os.path.join(root, LATEST_FILE), str(step))


def list_step_folders(root: str) -> list[tuple[int, str]]:
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_RE.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def prune_checkpoints(root: str, max_actor: int | None, max_critic: int | None) -> list[str]:
    """Keep the newest ``max_actor`` actor and ``max_critic`` critic checkpoints (None/<=0: keep all).

    A step folder whose actor and critic are both gone is removed as a whole. Returns removed paths.
    """
    removed = []
    steps = list_step_folders(root)
    for sub, keep in (("actor", max_actor), ("critic", max_critic)):
        if not keep or keep <= 0:
            continue
        with_sub = [(s, p) for s, p in steps if os.path.isdir(os.path.join(p, sub))]
        for _, path in with_sub[:-keep]:
            shutil.rmtree(os.path.join(path, sub), ignore_errors=True)
            removed.append(os.path.join(path, sub))
    latest = find_latest_ckpt_path(root)
    for _, path in steps:
        if path == latest:
            continue
        if not any(os.path.isdir(os.path.join(path, sub)) for sub in ("actor", "critic")) and removed:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def stopped_run_error(err: WorkerError, step: int, root: str) -> WorkerError:
    """The error a run stops with when a worker died or raised: role, rank, step, and what to resume from."""
    latest = find_latest_ckpt_path(root)
    resume = (f"last complete checkpoint: {latest}; run the same command again (trainer.resume_mode=auto) to "
              "continue from it" if latest else f"no complete checkpoint under {root} yet (trainer.save_freq sets "
              "how often one is written); a new run starts from step 1")
    role = getattr(err, "role", "?")
    msg = f"training stopped at global step {step}: role {role!r} rank {err.rank} failed; {resume}.\n{err}"
    stopped = WorkerError(msg, rank=err.rank, cause=err.cause)
    stopped.role = role
    return stopped


class CheckpointMixin:
    """Save and resume of ``RayPPOTrainer`` in the layout above. A trainer that draws data ahead or keeps
    more driver state overrides ``_loader_checkpoint_state`` / ``_driver_state`` / ``_restore_driver_state``.

    Needs on ``self``: ``typed_config``, ``global_steps``, ``metric_history``, ``actor_rollout_wg``, ``use_critic``
    (and ``critic_wg``), ``train_dataloader`` and ``kl_ctrl_in_reward``.
    """

    def _checkpoint_root(self) -> str:
        return os.path.abspath(os.path.expanduser(str(self.typed_config.trainer.default_local_dir)))

    def _save_checkpoint(self) -> None:
        root = self._checkpoint_root()
        folder = step_folder(root, self.global_steps)
        trainer_cfg = self.typed_config.trainer
        max_actor, max_critic = trainer_cfg.max_actor_ckpt_to_keep, trainer_cfg.max_critic_ckpt_to_keep
        print(f"Saving checkpoint to {folder}")
        self.actor_rollout_wg.save_checkpoint(os.path.join(folder, "actor"), None, self.global_steps,
                                              max_ckpt_to_keep=max_actor)
        if self.use_critic:
            self.critic_wg.save_checkpoint(os.path.join(folder, "critic"), None, self.global_steps,
                                           max_ckpt_to_keep=max_critic)
        os.makedirs(folder, exist_ok=True)
        torch.save(self._loader_checkpoint_state(), os.path.join(folder, "data.pt"))
        torch.save(self._driver_state(), os.path.join(folder, "trainer_state.pt"))
        mark_latest(root, self.global_steps)  # last: a crash before this line leaves the previous step as latest
        prune_checkpoints(root, max_actor, max_critic)

    def _loader_checkpoint_state(self) -> dict:
        """The data loader position a checkpoint records (a trainer that draws ahead returns an earlier one)."""
        return self.train_dataloader.state_dict()

    def _load_checkpoint(self) -> int:
        mode = self.typed_config.trainer.resume_mode
        if mode == "disable":
            return 0
        if mode == "auto":
            folder = find_latest_ckpt_path(self._checkpoint_root())
            if folder is None:
                print("Training from scratch")
                return 0
        elif mode == "resume_path":
            folder = os.path.abspath(os.path.expanduser(str(self.typed_config.trainer.resume_from_path)))
        else:
            raise ValueError(f"trainer.resume_mode={mode!r} is not one of: auto, disable, resume_path")
        if "global_step_" not in folder:
            raise ValueError(f"resume folder {folder} must be named global_step_N")
        self.global_steps = int(folder.rstrip("/").split("global_step_")[-1])
        print(f"Resuming from {folder} (global step {self.global_steps})")
        delete = bool(self.typed_config.trainer.del_local_ckpt_after_load)
        self.actor_rollout_wg.load_checkpoint(os.path.join(folder, "actor"), del_local_after_load=delete)
        if self.use_critic:
            self.critic_wg.load_checkpoint(os.path.join(folder, "critic"), del_local_after_load=delete)
        data_path = os.path.join(folder, "data.pt")
        if os.path.exists(data_path):
            self.train_dataloader.load_state_dict(torch.load(data_path, weights_only=False))
        else:
            print(f"Warning: no dataloader state at {data_path}; the data order restarts")
        state_path = os.path.join(folder, "trainer_state.pt")
        if os.path.exists(state_path):
            self._restore_driver_state(torch.load(state_path, weights_only=False))
        return self.global_steps

    def _driver_state(self) -> dict:
        state = {"global_steps": self.global_steps, "metric_history": list(self.metric_history)}
        if self.kl_ctrl_in_reward is not None:
            state["kl_ctrl_value"] = float(self.kl_ctrl_in_reward.value)
        return state

    def _restore_driver_state(self, state: dict) -> None:
        self.metric_history = list(state.get("metric_history", []))
        if self.kl_ctrl_in_reward is not None and "kl_ctrl_value" in state:
            self.kl_ctrl_in_reward.value = state["kl_ctrl_value"]
