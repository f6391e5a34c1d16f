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

from verl.protocol import WorkerError
from verl.utils.fs import atomic_write_text

__all__ = ["LATEST_FILE", "step_folder", "find_latest_ckpt_path", "mark_latest", "prune_checkpoints",
           "list_step_folders", "stopped_run_error"]

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
