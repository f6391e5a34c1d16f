"""Checks of ``sft_trainer.yaml`` values that can fail before any model is loaded.

Everything here raises :class:`verl.utils.config.ConfigError` with the key and a value that would work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.utils.config import ConfigError

__all__ = ["SFTPlan", "validate_sft_config", "as_list"]


@dataclass(frozen=True)
class SFTPlan:
    """The numbers the trainer needs, derived once from the config and the world size."""

    device: str
    world_size: int
    global_batch_size: int  # data.train_batch_size
    batch_size_per_rank: int
    micro_batch_size_per_rank: int
    grad_accum_steps: int
    train_files: list
    val_files: list  # empty: no validation


def as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (ListConfig, list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _check_files(files: list, key: str) -> list:
    out = []
    for path in files:
        local = os.path.expanduser(path)
        if "://" in path:
            raise ConfigError(f"{key}={path!r}: only local files are supported; copy it to a local directory")
        if not os.path.exists(local):
            raise ConfigError(
                f"{key}: file {path!r} does not exist (looked at {os.path.abspath(local)}). For the embedded task run "
                "`python examples/data_preprocess/arithmetic.py --local_dir <dir>` and pass <dir>/sft_train.parquet"
            )
        out.append(local)
    return out


def _check_choice(config: DictConfig, key: str, choices) -> None:
    value = OmegaConf.select(config, key)
    if value not in choices:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(map(str, choices))}")


def validate_sft_config(config: DictConfig, world_size: int, device: str) -> SFTPlan:
    """Check keys we cannot honour, batch arithmetic and input files; return the derived :class:`SFTPlan`."""
    data, model, trainer = config.data, config.model, config.trainer

    if int(config.get("ulysses_sequence_parallel_size", 1)) != 1:
        raise ConfigError(
            "ulysses_sequence_parallel_size > 1 is not supported by this SFT trainer; set ulysses_sequence_parallel_size=1"
        )
    if model.get("use_liger", False):
        raise ConfigError("model.use_liger=True needs the liger-kernel GPU kernels, not available here; set model.use_liger=False")
    _check_choice(config, "model.strategy", ("fsdp", "fsdp2"))
    _check_choice(config, "data.truncation", ("error", "left", "right"))
    _check_choice(config, "optim.lr_scheduler", ("cosine", "constant"))
    _check_choice(config, "trainer.resume_mode", ("auto", "disable", "resume_path"))
    if trainer.get("default_hdfs_dir"):
        raise ConfigError("trainer.default_hdfs_dir: HDFS is not supported here; set it to null and use trainer.default_local_dir")
    if trainer.resume_mode == "resume_path" and not trainer.get("resume_from_path"):
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<dir of global_step_N>")
    if int(model.get("lora_rank", 0) or 0) < 0:
        raise ConfigError(f"model.lora_rank={model.lora_rank} must be >= 0 (0 = full fine-tuning)")
    for key in ("trainer.total_epochs",):
        if int(OmegaConf.select(config, key)) < 1:
            raise ConfigError(f"{key} must be >= 1")
    steps = trainer.get("total_training_steps")
    if steps is not None and int(steps) < 1:
        raise ConfigError(f"trainer.total_training_steps={steps} must be >= 1 (or null)")

    global_bs = int(data.train_batch_size)
    if global_bs < 1 or global_bs % world_size != 0:
        raise ConfigError(
            f"data.train_batch_size={global_bs} must be a positive multiple of the number of processes ({world_size})"
        )
    per_rank = global_bs // world_size
    micro = data.get("micro_batch_size_per_gpu")
    if data.get("micro_batch_size") is not None:
        if int(data.micro_batch_size) % world_size != 0:
            raise ConfigError(
                f"data.micro_batch_size={data.micro_batch_size} must be divisible by the number of processes ({world_size}); "
                "better: set data.micro_batch_size_per_gpu instead (data.micro_batch_size is deprecated)"
            )
        micro = int(data.micro_batch_size) // world_size
    if micro is None or int(micro) < 1:
        raise ConfigError(f"data.micro_batch_size_per_gpu={micro} must be >= 1")
    micro = int(micro)
    if per_rank % micro != 0:
        raise ConfigError(
            f"data.train_batch_size per process ({global_bs} / {world_size} = {per_rank}) must be divisible by "
            f"data.micro_batch_size_per_gpu={micro}; e.g. data.micro_batch_size_per_gpu="
            f"{max(d for d in range(1, micro + 1) if per_rank % d == 0)}"
        )

    train_files = _check_files(as_list(data.train_files), "data.train_files")
    if not train_files:
        raise ConfigError("data.train_files is empty; give one or more parquet files")
    val_files = _check_files(as_list(data.get("val_files")), "data.val_files")
    return SFTPlan(
        device=device,
        world_size=world_size,
        global_batch_size=global_bs,
        batch_size_per_rank=per_rank,
        micro_batch_size_per_rank=micro,
        grad_accum_steps=per_rank // micro,
        train_files=train_files,
        val_files=val_files,
    )
