"""Supervised fine-tuning in verl 0.7's engine layout: ``python -m verl.trainer.sft_trainer key=value ...``.

    python -m verl.trainer.sft_trainer data.train_files=... model.path=...
    torchrun --standalone --nnodes=1 --nproc_per_node=N -m verl.trainer.sft_trainer ...
    python -m verl.trainer.sft_trainer --check-config ...    # every check, nothing started: "config ok" / exit 2

Config: ``verl/trainer/config/sft_trainer_engine.yaml`` (verl's name, keys and defaults), composed from the Hydra
groups ``model@model=hf_model``, ``engine@engine=fsdp``, ``optim@optim=fsdp`` and ``profiler@profiler=profiler``;
schema: :mod:`verl.trainer.config_schema.sft_engine`. The trainer is ``verl.trainer.fsdp_sft_trainer``'s
(:class:`~verl.trainer.fsdp_sft_trainer.FSDPSFTTrainer`: loop, response-token loss normalised over the global
batch, validation, checkpoints, resume, loggers); this module maps the layout onto it and onto verl's typed
config objects (``HFModelConfig``, ``FSDPEngineConfig``, ``FSDPOptimizerConfig``, ``CheckpointConfig``, carried by
a ``TrainingWorkerConfig`` as in verl):

- rows: chat message lists in the ``data.messages_key`` column (``MultiTurnSFTDataset``: loss on the assistant
  turns), or your class (``data.custom_cls.{path,name}``); ``data.max_length`` / ``truncation``,
  ``train_max_samples`` / ``val_max_samples``; ``model.custom_chat_template`` replaces the tokenizer's template.
- batches: ``data.train_batch_size`` rows per optimizer step over all processes; each process's share is cut into
  forward passes by tokens (``data.use_dynamic_bsz``, ``max_token_len_per_gpu``) or by
  ``micro_batch_size_per_gpu`` rows (also the validation batch). The loss is the same either way.
- model: ``model.path`` (tokenizer from ``model.tokenizer_path`` if set), ``override_config``, LoRA
  (``lora_rank`` / ``lora_alpha`` / ``target_modules`` / ``exclude_modules``, or ``lora_adapter_path``; merged into
  the saved model), ``enable_gradient_checkpointing``, ``use_remove_padding`` (packed rows), ``use_fused_kernels``.
- engine (``engine=fsdp``): FSDP2 with weights in ``engine.model_dtype`` computing in ``engine.dtype``;
  ``fsdp_size`` (HSDP), ``reshard_after_forward``, ``forward_prefetch``, ``param_offload`` / ``optimizer_offload`` /
  ``offload_policy``, ``ulysses_sequence_parallel_size`` (with ``model.use_remove_padding``), ``use_torch_compile``,
  ``seed``; ``engine.strategy`` fsdp | fsdp2 (both FSDP2).
- optimizer (``optim=fsdp``): ``optim.optimizer`` from ``optimizer_impl`` (``override_optimizer_config``), lr,
  ``weight_decay``, ``betas``, warm-up (``lr_warmup_steps`` or ``lr_warmup_steps_ratio``), then ``lr_scheduler_type``
  (or ``warmup_style``) constant | cosine with ``min_lr_ratio`` / ``num_cycles``; ``clip_grad``.
- length, validation, saving: ``trainer.total_epochs`` or ``total_training_steps``; ``test_freq`` / ``save_freq``
  (N steps or ``after_each_epoch``); every save writes ``global_step_<N>/huggingface`` (a complete HF model dir)
  plus the resumable state of ``checkpoint.save_contents``; ``trainer.resume_mode`` auto | disable | resume_path;
  ``trainer.logger`` backends (``train/loss``, ``train/grad_norm``, ``train/lr(1e-3)``, ``val/loss``).

On a CPU host four of verl's GPU defaults that only cost time there change unless you set them (printed at the
start): ``engine.dtype`` bfloat16 -> fp32 (without native bf16), ``engine.use_torch_compile`` -> false,
``model.enable_gradient_checkpointing`` -> false (when the training state fits in memory) and
``engine.reshard_after_forward`` -> false (one process).

Refused by name: ``engine=megatron`` / ``veomni`` and ``optim=megatron`` / ``veomni`` (use ``engine=fsdp
optim=fsdp``), profiling (``profiler.enable``, ``trainer.profile_interval``), data files with image or video columns
(verl's VLM SFT), and each key the schema accepts only at its default.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import sys
from dataclasses import dataclass
from operator import attrgetter

import hydra
import psutil
import pyarrow.parquet as pq
import torch.distributed as dist
import torch.utils.data
from omegaconf import DictConfig, OmegaConf

from verl.trainer.check_config import check_config_if_asked, compose_cli, config_error_exit, split_cli
from verl.trainer.config_schema.engine import CheckpointConfig
from verl.trainer.config_schema.sft_engine import AFTER_EACH_EPOCH, SFTEngineTrainerConfig
from verl.trainer.config_schema.spec import build, check_config
from verl.trainer.fsdp_sft_trainer import (CONFIG_DIR, FSDPSFTTrainer, _set_cpu_threads,
                                           initialize_global_process_group, load_tokenizer)
from verl.trainer.fsdp_sft_trainer import preflight as legacy_preflight
from verl.trainer.host_defaults import HostChoices, _cpu_isa, _weights_bytes, explicit_override_keys
from verl.trainer.sft.config import SFTPlan
from verl.utils.config import ConfigError, check_overrides
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
from verl.utils.device import cpu_has_native_bf16
from verl.utils.fs import copy_to_local
from verl.utils.fsdp_utils import create_device_mesh
from verl.utils.import_utils import load_extern_type
from verl.utils.tokenizer import hf_processor
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig
from verl.workers.config.base import coerce_section
from verl.workers.config.data import SFTDataConfig
from verl.workers.engine import MicroBatchSpec
from verl.workers.engine.config import training_worker_engine_config

__all__ = ["CONFIG_NAME", "SFTRun", "SFTTrainer", "check_command_line", "prepare", "run_sft", "main"]

CONFIG_NAME = "sft_trainer_engine"
ENGINE_GROUPS = ("engine", "optim")
OTHER_ENGINES = {
    "megatron": "verl.trainer.sft_trainer trains with the FSDP engine here (the Megatron engine runs PPO's roles: "
                "python -m verl.trainer.main_ppo --config-name ppo_megatron_trainer)",
    "veomni": "the VeOmni engine is not available",
}
MEDIA_COLUMNS = ("images", "videos")  # verl's MultiTurnSFTDataset image_key / video_key


# ------------------------------------------------------------------------------------------------ the checks
def refuse_other_engines(argv: list[str]) -> None:
    """``engine=`` / ``optim=`` group choices other than ``fsdp``: a ConfigError naming the choice."""
    for arg in argv:
        name, sep, choice = arg.partition("=")
        if sep and name.lstrip("+") in ENGINE_GROUPS and choice.strip() != "fsdp":
            why = OTHER_ENGINES.get(choice.strip(), f"the {name.lstrip('+')} groups here are: fsdp")
            raise ConfigError(f"{name.lstrip('+')}={choice.strip()} is not supported: {why}; use engine=fsdp "
                              "optim=fsdp")


def _check_cli_overrides(argv: list[str]) -> None:
    """The command line before composition: other engines are refused, unknown or misspelled keys get a "did you
    mean" (against the config the chosen groups compose)."""
    refuse_other_engines(argv)
    config_dir, name, overrides = split_cli(argv, CONFIG_DIR, CONFIG_NAME)
    groups = [o for o in overrides if o.partition("=")[0].lstrip("+") in ENGINE_GROUPS + ("model", "profiler")]
    base = compose_cli([f"--config-path={config_dir}", f"--config-name={name}", *groups], CONFIG_DIR, CONFIG_NAME)
    for warning in check_overrides(base, overrides):
        print(warning, file=sys.stderr)


_LEGACY_NAMES = (  # sft_trainer.yaml's names in messages of the checks shared with it -> this yaml's
    (re.compile(r"\bmodel\.partial_pretrain\b"), "model.path"),
    (re.compile(r"(?<![\w.])ulysses_sequence_parallel_size\b"), "engine.ulysses_sequence_parallel_size"),
    (re.compile(r"(?<![\w.])use_remove_padding\b"), "model.use_remove_padding"),
    (re.compile(r"\btrainer\.checkpoint\."), "checkpoint."),
    (re.compile(r"\bdata\.multiturn\.messages_key\b"), "data.messages_key"),
    (re.compile(r"\bdata\.chat_template\b"), "model.custom_chat_template"),
)


def _renamed(message: str) -> str:
    for pattern, name in _LEGACY_NAMES:
        message = pattern.sub(name, message)
    return message


def _check_freq(typed: SFTEngineTrainerConfig) -> None:
    for name in ("save_freq", "test_freq"):
        value = getattr(typed.trainer, name)
        if isinstance(value, str) and value != AFTER_EACH_EPOCH:
            raise ConfigError(f"trainer.{name}={value!r} must be a number of steps (-1: off) or {AFTER_EACH_EPOCH!r}")


def _check_fsdp_size(typed: SFTEngineTrainerConfig, world_size: int) -> None:
    size = typed.engine.fsdp_size
    if 0 < size < world_size and world_size % size:
        raise ConfigError(f"engine.fsdp_size={size} must divide the number of processes ({world_size}, from torchrun "
                          "--nproc_per_node x --nnodes) or be -1 (shard over all of them)")


def _check_no_media(files: list[str], key: str) -> None:
    """verl's VLM SFT (rows with images or videos, a processor) is not available: refuse such files by name."""

    for path in files:
        columns = set(pq.read_schema(path).names)
        found = [c for c in MEDIA_COLUMNS if c in columns]
        if found:
            raise ConfigError(f"{key}: {path} has a {found[0]!r} column: SFT on image or video rows (verl's VLM SFT) "
                              "is not available in verl.trainer.sft_trainer here; train on text-only message rows "
                              "(the PPO trainer takes VLM prompts: data.image_key)")


def _section(config: DictConfig, name: str) -> dict:
    return OmegaConf.to_container(config[name], resolve=True)


# engine keys whose meaning in SFT is not a PPO role's fsdp_config's (the schema says which): the Ulysses size runs
# here (a PPO fsdp_config refuses it), SFT computes no entropy, and it always trains
SFT_ENGINE_KEYS = ("ulysses_sequence_parallel_size", "entropy_from_logits_with_chunking", "entropy_checkpointing",
                   "forward_only")


def training_worker_config(config: DictConfig) -> TrainingWorkerConfig:
    """verl's typed objects of the ``model``, ``engine``, ``optim`` and ``checkpoint`` sections, carried as verl's
    SFT trainer carries them. :data:`SFT_ENGINE_KEYS` stay out of the engine's (the schema checked them; the Ulysses
    size reaches the engine from ``engine.ulysses_sequence_parallel_size`` directly)."""
    engine = {k: v for k, v in _section(config, "engine").items() if k not in SFT_ENGINE_KEYS}
    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=coerce_section(HFModelConfig, _section(config, "model"), "model.", strict=False),
        engine_config=coerce_section(FSDPEngineConfig, engine, "engine.", strict=False),
        optimizer_config=coerce_section(FSDPOptimizerConfig, _section(config, "optim"), "optim.", strict=False),
        checkpoint_config=coerce_section(CheckpointConfig, _section(config, "checkpoint"), "checkpoint.",
                                         strict=False))


def legacy_config(typed: SFTEngineTrainerConfig) -> DictConfig:
    """The run in ``sft_trainer.yaml``'s layout: what :class:`FSDPSFTTrainer` and the checks shared with
    ``verl.trainer.fsdp_sft_trainer`` read. The model itself is built from the typed sections (:class:`SFTTrainer`).
    With ``data.use_dynamic_bsz`` the rows of a forward pass are counted in tokens, so no row count has to divide
    the batch (1 stands in for it here)."""
    data, model, trainer = typed.data, typed.model, typed.trainer
    launcher = {}
    if (trainer.nnodes, trainer.n_gpus_per_node) != (1, 1):  # verl's defaults here: the launcher decides
        launcher = {"nnodes": trainer.nnodes, "n_gpus_per_node": trainer.n_gpus_per_node}
    freq = {name: -1 if getattr(trainer, name) == AFTER_EACH_EPOCH else getattr(trainer, name)
            for name in ("save_freq", "test_freq")}  # after_each_epoch: set once the epoch length is known
    return OmegaConf.create({
        "data": {"train_batch_size": data.train_batch_size,
                 "micro_batch_size_per_gpu": 1 if data.use_dynamic_bsz else data.micro_batch_size_per_gpu,
                 "train_files": data.train_files, "val_files": data.val_files,
                 "train_max_samples": data.train_max_samples, "val_max_samples": data.val_max_samples,
                 "multiturn": {"enable": True, "messages_key": data.messages_key},
                 "max_length": data.max_length, "truncation": data.truncation,
                 "chat_template": model.custom_chat_template},
        "model": {"partial_pretrain": model.path, "use_shm": model.use_shm, "external_lib": model.external_lib,
                  "trust_remote_code": model.trust_remote_code},
        "ulysses_sequence_parallel_size": typed.engine.ulysses_sequence_parallel_size,
        "use_remove_padding": model.use_remove_padding,
        "trainer": {"default_local_dir": trainer.default_local_dir, "project_name": trainer.project_name,
                    "experiment_name": trainer.experiment_name, "total_epochs": trainer.total_epochs,
                    "total_training_steps": trainer.total_training_steps, "logger": trainer.logger,
                    "seed": trainer.seed, **freq, "max_ckpt_to_keep": trainer.max_ckpt_to_keep,
                    "resume_mode": trainer.resume_mode, "resume_from_path": trainer.resume_from_path,
                    "checkpoint": {"save_contents": typed.checkpoint.save_contents,
                                   "load_contents": typed.checkpoint.load_contents},
                    "device": trainer.device, **launcher},
    })


@dataclass(frozen=True)
class SFTRun:
    """Everything the checks derive from a composed ``sft_trainer_engine.yaml``."""

    config: DictConfig  # as composed (the user's layout)
    typed: SFTEngineTrainerConfig
    worker: TrainingWorkerConfig
    legacy: DictConfig
    plan: SFTPlan
    device: str
    model_path: str


def prepare(config: DictConfig, world_size: int) -> SFTRun:
    """Every check before anything starts (what ``--check-config`` runs): each key against the schema, verl's typed
    sections, the batch arithmetic, the input files, the model directory and its heads for sequence parallelism.
    Raises ConfigError naming this yaml's key."""
    check_config(config, SFTEngineTrainerConfig)
    typed = build(SFTEngineTrainerConfig, config)
    _check_freq(typed)
    _check_fsdp_size(typed, world_size)
    worker = training_worker_config(config)
    legacy = legacy_config(typed)
    try:
        device, plan, model_path = legacy_preflight(legacy, world_size)
    except ConfigError as e:
        raise ConfigError(_renamed(str(e))) from None
    _check_no_media(plan.train_files, "data.train_files")
    _check_no_media(plan.val_files, "data.val_files")
    if typed.data.use_dynamic_bsz:  # the validation batch; training passes are cut by tokens
        plan = dataclasses.replace(plan, micro_batch_size_per_rank=typed.data.micro_batch_size_per_gpu)
    return SFTRun(config, typed, worker, legacy, plan, device, model_path)


def check_command_line(argv: list[str]) -> DictConfig:
    """What ``python -m verl.trainer.sft_trainer --check-config key=value ...`` checks, in this process: the
    command line, the composition and :func:`prepare`. The number of processes is torchrun's (``WORLD_SIZE``; a
    plain ``python -m`` checks one). Loads no model, starts nothing, writes nothing."""
    _check_cli_overrides(argv)
    config = compose_cli(argv, CONFIG_DIR, CONFIG_NAME)
    prepare(config, int(os.environ.get("WORLD_SIZE", 1)))
    return config


# ------------------------------------------------------------------------------------------------ host defaults
# verl's GPU defaults that only cost time on a CPU host: key -> (verl's default, the CPU value, why)
CPU_DEFAULTS = {
    "engine.dtype": ("bfloat16", "fp32", "bf16 is emulated on this CPU (no AVX-512 BF16 / AMX): 10-20x slower"),
    "engine.use_torch_compile": (True, False, "compiling the decoder layers costs 10-45 s per process on CPU"),
    "model.enable_gradient_checkpointing": (True, False, "the training state fits in memory: recomputing "
                                                         "activations only costs time"),
    "engine.reshard_after_forward": (True, False, "one process: its shard is the whole model"),
}


def resolve_cpu_defaults(config: DictConfig, run: SFTRun, explicit: set[str]) -> HostChoices:
    """On CPU, :data:`CPU_DEFAULTS` for the keys the user left at verl's default. The decisions read the checked
    run (its typed config); the changes are written to ``config``, from which the run is prepared again."""
    choices = HostChoices(device=run.device)
    if run.device != "cpu":
        return choices
    choices.isa, choices.native_bf16 = _cpu_isa(), cpu_has_native_bf16()
    memory = psutil.virtual_memory().total
    choices.memory_gib = memory / 1024**3
    applies = {"engine.dtype": not choices.native_bf16,
               "engine.use_torch_compile": True,
               # weights, gradients, two Adam moments and as much again for activations in half the memory
               "model.enable_gradient_checkpointing": 0 < 8 * _weights_bytes(run.model_path) < memory / 2,
               "engine.reshard_after_forward": run.plan.world_size == 1}
    for key, (verl_default, cpu_value, why) in CPU_DEFAULTS.items():
        if applies[key] and key not in explicit and attrgetter(key)(run.typed) == verl_default:
            OmegaConf.update(config, key, cpu_value, merge=False)
            choices.changed.append((key, verl_default, cpu_value, why))
    return choices


# ------------------------------------------------------------------------------------------------ the run
def create_dataset(run: SFTRun, files: list[str], tokenizer, max_samples: int):
    """``data.custom_cls`` (called with the arguments of verl's: parquet_files, tokenizer, config, processor,
    max_samples, as far as it accepts them), else ``MultiTurnSFTDataset`` over ``data.messages_key``."""
    data = run.typed.data
    if not data.custom_cls.path:
        config = SFTDataConfig(multiturn={"enable": True, "messages_key": data.messages_key},
                               max_length=data.max_length, truncation=data.truncation,
                               chat_template=run.typed.model.custom_chat_template)
        try:
            return MultiTurnSFTDataset(files, tokenizer, config, max_samples=max_samples)
        except KeyError as e:  # a missing column, named by its key
            raise ConfigError(_renamed(str(e.args[0]))) from None

    dataset_cls = load_extern_type(data.custom_cls.path, data.custom_cls.name)
    offered = dict(parquet_files=files, tokenizer=tokenizer, config=run.config.data,
                   processor=hf_processor(run.model_path), max_samples=max_samples)
    params = inspect.signature(dataset_cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    dataset = dataset_cls(**{k: v for k, v in offered.items() if takes_any or k in params})
    if "max_samples" not in params and not takes_any and 0 < max_samples < len(dataset):

        dataset = torch.utils.data.Subset(dataset, range(max_samples))
    return dataset


class SFTTrainer(FSDPSFTTrainer):
    """:class:`FSDPSFTTrainer` over verl 0.7's layout: the engine built from the typed ``model`` / ``engine`` /
    ``optim`` / ``checkpoint`` sections, forward passes cut by ``data.use_dynamic_bsz``, and ``after_each_epoch``
    frequencies."""

    def __init__(self, run: SFTRun, device_mesh, tokenizer, train_dataset, val_dataset=None):
        self.run = run
        super().__init__(run.legacy, device_mesh, tokenizer, train_dataset, val_dataset, plan=run.plan)
        for name in ("save_freq", "test_freq"):
            if getattr(run.typed.trainer, name) == AFTER_EACH_EPOCH:
                self.config.trainer[name] = self.steps_per_epoch

    def engine_config(self, local_path: str):
        return training_worker_engine_config(self.run.worker, self.total_steps, self.plan.sp_size)

    def micro_batch_spec(self) -> MicroBatchSpec:
        data = self.run.typed.data
        if data.use_dynamic_bsz:
            return MicroBatchSpec(use_dynamic_bsz=True, max_token_len=data.max_token_len_per_gpu)
        return super().micro_batch_spec()

    def tracked_config(self) -> dict:
        return OmegaConf.to_container(self.run.config, resolve=True)


def run_sft(config: DictConfig, explicit: set[str] = frozenset()) -> dict:
    """Check, set up the process group, build tokenizer and datasets, train. Returns the last metrics.
    ``explicit``: the keys set on the command line (they keep their values on a CPU host)."""
    run = prepare(config, int(os.environ.get("WORLD_SIZE", 1)))
    choices = resolve_cpu_defaults(config, run, explicit)
    if choices.changed:
        run = prepare(config, run.plan.world_size)
    os.environ["VERL_DEVICE"] = run.device  # every device question in this process follows trainer.device
    if run.device == "cpu":
        _set_cpu_threads()
    _, rank, world_size = initialize_global_process_group(run.device)
    try:
        if rank == 0 and run.device == "cpu":
            print(choices, flush=True)

        device_mesh = create_device_mesh(world_size, run.typed.engine.fsdp_size)
        model = run.typed.model
        tokenizer_path = copy_to_local(model.tokenizer_path) if model.tokenizer_path else run.model_path
        tokenizer = load_tokenizer(tokenizer_path, model.trust_remote_code, model.custom_chat_template)
        data = run.typed.data
        train = create_dataset(run, run.plan.train_files, tokenizer, data.train_max_samples)
        val = create_dataset(run, run.plan.val_files, tokenizer, data.val_max_samples) if run.plan.val_files else None
        return SFTTrainer(run, device_mesh, tokenizer, train, val).fit()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@hydra.main(config_path="config", config_name=CONFIG_NAME, version_base=None)
def main(config: DictConfig) -> None:
    try:
        run_sft(config, explicit_override_keys())
    except ConfigError as e:
        config_error_exit(e)


def _precheck_cli(argv: list[str]) -> None:
    """:func:`_check_cli_overrides` before Hydra starts (its --help, --cfg ... are left to it)."""
    if any(a.startswith("-") and a.partition("=")[0] not in ("--config-name", "-cn", "--config-path", "-cp")
           for a in argv):
        return
    try:
        _check_cli_overrides(argv)
    except ConfigError as e:
        config_error_exit(e)


if __name__ == "__main__":
    check_config_if_asked(check_command_line)  # --check-config: check, print ``config ok`` / the error, exit 0 / 2
    _precheck_cli(sys.argv[1:])
    main()
