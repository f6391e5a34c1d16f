from verl.utils.checkpoint.checkpoint_manager import (
    BaseCheckpointManager,
    find_latest_ckpt_path,
    get_checkpoint_tracker_filename,
)

__all__ = ["BaseCheckpointManager", "find_latest_ckpt_path", "get_checkpoint_tracker_filename"]
