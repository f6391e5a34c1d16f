"""Checks of ``sft_trainer.yaml`` values that can fail before any model is loaded.

Every key is checked against the schema (:mod:`verl.trainer.config_schema.sft`: types, ranges, choices, keys
accepted only at their default), then the batch arithmetic and the input files. Everything here raises
:class:`verl.utils.config.ConfigError` with the key and a value that would work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig

from verl.trainer.config_schema.sft import SFTTrainerConfig
from verl.trainer.config_schema.spec import build, check_config, check_value, specs
from verl.utils.config import ConfigError
from verl.utils.tracking import check_backend_packages
from verl.utils.ulysses import _model_heads, check_ulysses_size

__all__ = ["SFTPlan", "validate_sft_config", "check_sequence_parallel_model", "typed_sft_config", "as_list"]

_LAUNCHER_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node")


@dataclass(frozen=True)
class SFTPlan:
    """The numbers the trainer needs, derived once from the config and the world size."""

    device: str
    world_size: int
    global_batch_size: int  # data.train_batch_size
    sp_size: int  # ulysses_sequence_parallel_size: ranks that work on the same rows
    dp_size: int  # world_size // sp_size: groups that each take a share of the rows
    batch_size_per_rank: int
    micro_batch_size_per_rank: int
    grad_accum_steps: int
    train_files: list
    val_files: list  # empty: no validation
    config: SFTTrainerConfig = None  # the whole config, typed and frozen


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


def typed_sft_config(config: DictConfig) -> SFTTrainerConfig:
    """The (validated) SFT config as frozen typed objects."""
    return build(SFTTrainerConfig, config)


def _check_launcher_keys(config: SFTTrainerConfig, world_size: int) -> None:
    """trainer.nnodes / n_gpus_per_node: the launcher sets the world size; a non-default pair must agree with it."""
    table = specs(SFTTrainerConfig)
    values = {"trainer.nnodes": config.trainer.nnodes, "trainer.n_gpus_per_node": config.trainer.n_gpus_per_node}
    for k, v in values.items():
        check_value(table[k], v)
    if all(v == table[k].default for k, v in values.items()):
        return
    nnodes, per_node = values["trainer.nnodes"], values["trainer.n_gpus_per_node"]
    if nnodes * per_node != world_size:
        bad = "trainer.n_gpus_per_node" if per_node != table["trainer.n_gpus_per_node"].default else "trainer.nnodes"
        raise ConfigError(f"{bad}={values[bad]} disagrees with the launcher: trainer.nnodes * trainer.n_gpus_per_node = "
                          f"{nnodes} * {per_node} != {world_size} processes (WORLD_SIZE); the world size comes from "
                          "torchrun --nnodes/--nproc_per_node, so match it or leave both keys at their defaults")


def _check_sequence_parallel(config: SFTTrainerConfig, world_size: int) -> int:
    """``ulysses_sequence_parallel_size``: divides the number of processes, and packs (``use_remove_padding``)."""
    sp_size = int(config.ulysses_sequence_parallel_size)
    if sp_size == 1:
        return 1
    if world_size % sp_size:
        raise ConfigError(f"ulysses_sequence_parallel_size={sp_size} must divide the number of processes "
                          f"({world_size}, from torchrun --nproc_per_node x --nnodes); use a divisor of {world_size}")
    if not config.use_remove_padding:
        raise ConfigError(f"ulysses_sequence_parallel_size={sp_size} needs use_remove_padding=true: the packed "
                          "sequence (rows without padding) is what is split across the ranks")
    return sp_size


def check_sequence_parallel_model(config: DictConfig | SFTTrainerConfig, model_path: str) -> None:
    """``ulysses_sequence_parallel_size`` must divide the model's attention and key/value heads (``config``: the
    composed ``sft_trainer.yaml`` or its typed form)."""
    sp_size = int(config.ulysses_sequence_parallel_size)
    if sp_size > 1:
        heads, kv_heads = _model_heads(model_path)
        try:
            check_ulysses_size(sp_size, sp_size, heads, kv_heads, key="ulysses_sequence_parallel_size")
        except ValueError as e:
            raise ConfigError(f"{e} (model.partial_pretrain={config.model.partial_pretrain})") from None


def validate_sft_config(config: DictConfig, world_size: int, device: str) -> SFTPlan:
    """Check every key against the schema, the batch arithmetic and input files; return the derived :class:`SFTPlan`."""
    check_config(config, SFTTrainerConfig, skip=lambda path: path in _LAUNCHER_KEYS)
    typed = typed_sft_config(config)
    data, trainer = typed.data, typed.trainer
    _check_launcher_keys(typed, world_size)
    check_backend_packages(trainer.logger)
    if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<dir of global_step_N>")

    sp_size = _check_sequence_parallel(typed, world_size)
    dp_size = world_size // sp_size
    groups = (f"the number of data-parallel groups ({world_size} processes / ulysses_sequence_parallel_size={sp_size}"
              f" = {dp_size})" if sp_size > 1 else f"the number of processes ({world_size})")
    global_bs = int(data.train_batch_size)
    if global_bs < 1 or global_bs % dp_size != 0:
        raise ConfigError(f"data.train_batch_size={global_bs} must be a positive multiple of {groups}")
    per_rank = global_bs // dp_size
    micro = data.micro_batch_size_per_gpu
    if data.micro_batch_size is not None:
        if int(data.micro_batch_size) % dp_size != 0:
            raise ConfigError(
                f"data.micro_batch_size={data.micro_batch_size} must be divisible by {groups}; "
                "better: set data.micro_batch_size_per_gpu instead (data.micro_batch_size is deprecated)"
            )
        micro = int(data.micro_batch_size) // dp_size
    if micro is None or int(micro) < 1:
        raise ConfigError(f"data.micro_batch_size_per_gpu={micro} must be >= 1")
    micro = int(micro)
    if per_rank % micro != 0:
        raise ConfigError(
            f"data.train_batch_size per data-parallel group ({global_bs} / {dp_size} = {per_rank}) must be divisible by "
            f"data.micro_batch_size_per_gpu={micro}; e.g. data.micro_batch_size_per_gpu="
            f"{max(d for d in range(1, micro + 1) if per_rank % d == 0)}"
        )

    train_files = _check_files(as_list(data.train_files), "data.train_files")
    if not train_files:
        raise ConfigError("data.train_files is empty; give one or more parquet files")
    val_files = _check_files(as_list(data.val_files), "data.val_files")
    return SFTPlan(
        device=device,
        world_size=world_size,
        global_batch_size=global_bs,
        sp_size=sp_size,
        dp_size=dp_size,
        batch_size_per_rank=per_rank,
        micro_batch_size_per_rank=micro,
        grad_accum_steps=per_rank // micro,
        train_files=train_files,
        val_files=val_files,
        config=typed,
    )
