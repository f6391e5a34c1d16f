"""Schema of ``sft_trainer_engine.yaml`` (``python -m verl.trainer.sft_trainer``): verl 0.7's engine layout of SFT.

The sections are those of verl's yaml: ``model`` (``model/hf_model.yaml``), ``engine`` and ``optim`` (the Hydra
groups ``engine=fsdp`` / ``optim=fsdp``), ``profiler``, ``data``, ``checkpoint`` and ``trainer``. Where a key means
what it means for a PPO role (the FSDP engine, the optimizer, the fused-kernel and tiled-MLP options) the PPO
schema's declaration is reused; where it is the SFT trainer's own (``sft.py``, the older layout) that one is. The
statuses differ where SFT differs: Ulysses sequence parallelism works in SFT, and SFT computes no entropy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from verl.trainer.config_schema.actor import FusedKernelOptions, TiledMLPConfig
from verl.trainer.config_schema.engine import CHECKPOINT_CONTENTS, FSDPConfig, OptimConfig
from verl.trainer.config_schema.places import (CKPT, ENGINE, SFT, SFT_CHECKS, SFT_DATA, SFT_ENGINE, SFT_MULTITURN,
                                              WORKERS)
from verl.trainer.config_schema.sft import SFT_TRUNCATIONS, SFTTrainerSection
from verl.trainer.config_schema.spec import Section, key, picked, section

__all__ = ["SFTEngineTrainerConfig", "AFTER_EACH_EPOCH", "PAD_MODES"]

AFTER_EACH_EPOCH = "after_each_epoch"
PAD_MODES = ("no_padding", "right_padding")
NO_ENTROPY = "SFT computes no entropy (the loss is the response tokens' cross-entropy), so no value changes what runs"
NO_PROFILING = ("profiling the SFT steps is not available in verl.trainer.sft_trainer; leave the default (PPO's "
                "global_profiler in main_ppo records torch traces)")
PROFILER_OFF = "profiler.enable is refused, so the profiler's settings take effect nowhere"
HERE = (SFT_ENGINE,)


@dataclass(frozen=True)
class SFTEngineCustomCls(Section):
    path: Optional[str] = key(None, ".py file defining your Dataset class (called with parquet_files, tokenizer, "
                                    "config, processor, max_samples as it accepts them)", read_in=HERE)
    name: Optional[str] = key(None, "the class name", read_in=HERE)


@dataclass(frozen=True)
class SFTEngineData(Section):
    """``data``: the rows (chat message lists), how they are cut and batched."""

    train_batch_size: int = key(256, "global batch (all ranks) per optimizer step", ge=1, read_in=(SFT_CHECKS,))
    micro_batch_size_per_gpu: int = key(4, "rows per forward/backward on one process with use_dynamic_bsz=false; "
                                           "always the validation batch", ge=1, read_in=(SFT_CHECKS, SFT_ENGINE))
    max_token_len_per_gpu: int = key(8192, "token budget of a micro-batch with use_dynamic_bsz=true", ge=1,
                                     read_in=HERE)
    use_dynamic_bsz: bool = key(True, "cut micro-batches by token count (max_token_len_per_gpu) instead of rows "
                                      "(the loss and the update are the same)", read_in=HERE)
    train_files: Union[str, list] = key("~/data/gsm8k/train.parquet", "training parquet file(s)",
                                        read_in=(SFT_CHECKS,))
    val_files: Optional[Union[str, list]] = key(None, "validation file(s) (null: none)", read_in=(SFT_CHECKS,))
    train_max_samples: int = key(-1, "rows of the training set used", ge=1, also=(-1,), also_doc="all",
                                 read_in=HERE)
    val_max_samples: int = key(-1, "rows of the validation set used", ge=1, also=(-1,), also_doc="all",
                               read_in=HERE)
    messages_key: str = key("messages", "column holding the chat messages (loss on the assistant turns)",
                            read_in=(SFT_ENGINE, SFT_MULTITURN))
    tools_key: str = key("tools", "column holding tool schemas",
                         unsupported="tool schemas in multi-turn SFT rows are not read here; leave the default")
    enable_thinking_key: str = key("enable_thinking", "column holding the thinking flag",
                                   unsupported="the thinking flag of multi-turn SFT rows is not read here; leave the "
                                               "default")
    pad_mode: str = key("no_padding", "no_padding | right_padding", choices=PAD_MODES,
                        inert="padding is packed away (model.use_remove_padding=true) or trimmed per micro-batch "
                              "(false) either way; the loss is the same")
    max_length: int = key(1024, "tokens per sequence", ge=1, read_in=(SFT_DATA, SFT_ENGINE))
    truncation: str = key("error", "overlong rows: error | left | right", choices=SFT_TRUNCATIONS,
                          read_in=(SFT_DATA, SFT_ENGINE))
    balance_dp_token: bool = key(False, "balance tokens across ranks",
                                 unsupported="the loss is always normalised by the global token count here (the effect "
                                             "balance_dp_token aims at); remove the override")
    custom_cls: SFTEngineCustomCls = section(SFTEngineCustomCls)
    use_shm: bool = key(False, "copy the data to /dev/shm",
                        unsupported="the data is read from its path directly; leave false")
    apply_chat_template_kwargs: dict = key({}, "extra arguments of the chat template (e.g. enable_thinking)",
                                           unsupported="the chat template is applied with its own defaults here; "
                                                       "leave it empty (or set model.custom_chat_template)")
    ignore_input_ids_mismatch: bool = key(False, "accept per-turn tokens that differ from the whole conversation's",
                                          inert="the conversation is rendered once as a whole and the assistant spans "
                                                "are located in it, so there are no per-turn tokens to mismatch")


@dataclass(frozen=True)
class SFTEngineModel(Section):
    """``model`` (verl's ``model/hf_model.yaml``): the checkpoint, its tokenizer and how it is adapted."""

    path: str = key("~/models/deepseek-llm-7b-chat", "local Hugging Face model directory", read_in=HERE)
    hf_config_path: Optional[str] = key(None, "a separate model config directory",
                                        unsupported="the model config is read from model.path; leave null")
    tokenizer_path: Optional[str] = key(None, "tokenizer directory (null: beside the model)", read_in=HERE)
    use_shm: bool = key(False, "copy the model to /dev/shm before loading", read_in=(SFT_ENGINE, SFT))
    trust_remote_code: bool = key(False, "allow model code from the checkpoint", read_in=(SFT_ENGINE, ENGINE))
    custom_chat_template: Optional[str] = key(None, "a Jinja chat template replacing the tokenizer's", read_in=HERE)
    external_lib: Optional[str] = key(None, "module imported first (registers custom model classes)",
                                      read_in=(SFT_ENGINE, SFT))
    override_config: dict = key({}, "free-form overrides of the HF model config (e.g. attn_implementation)",
                                read_in=(SFT_ENGINE, ENGINE))
    enable_gradient_checkpointing: bool = key(True, "recompute activations in backward (unset on a CPU host where "
                                                    "the training state fits in memory: false)",
                                              read_in=(SFT_ENGINE, ENGINE))
    enable_activation_offload: bool = key(False, "offload activations to the host",
                                          unsupported="activation offload is not available; leave false")
    use_remove_padding: bool = key(True, "pack each micro-batch's rows without padding (false: padded rows, "
                                         "trailing padding trimmed; same loss); Ulysses needs true",
                                   read_in=(SFT_ENGINE, SFT_CHECKS, ENGINE))
    lora_rank: int = key(0, "LoRA rank; > 0 trains adapters only (merged into the saved model)", ge=0,
                         read_in=(SFT_ENGINE, ENGINE))
    lora_alpha: float = key(16, "LoRA scaling numerator", gt=0, read_in=(SFT_ENGINE, ENGINE))
    target_modules: Union[str, list] = key("all-linear", "modules that get adapters", read_in=(SFT_ENGINE, ENGINE))
    exclude_modules: Optional[Union[str, list]] = key(None, "modules excluded from adapters",
                                                      read_in=(SFT_ENGINE, ENGINE))
    lora_adapter_path: Optional[str] = key(None, "a saved PEFT adapter trained further (its rank, alpha and target "
                                                 "modules apply)", read_in=(SFT_ENGINE, ENGINE))
    use_liger: bool = key(False, "liger kernels",
                          unsupported="liger kernels need the liger-kernel GPU kernels, not available here; set "
                                      "model.use_liger=False")
    use_fused_kernels: bool = key(False, "log-probs computed from hidden states in chunks of tokens, never holding "
                                         "[tokens, vocab] logits (same loss)", read_in=(SFT_ENGINE, ENGINE))
    fused_kernel_options: FusedKernelOptions = section(FusedKernelOptions)
    tiled_mlp: TiledMLPConfig = section(TiledMLPConfig)


@dataclass(frozen=True)
class SFTEngineFSDP(FSDPConfig):
    """``engine`` (``engine=fsdp``, verl's ``engine/fsdp.yaml``): the FSDP2 engine, as a PPO role's fsdp_config."""

    fsdp_size: int = key(-1, "ranks per FSDP shard group (HSDP when it divides the number of processes)", ge=1,
                         also=(-1,), also_doc="all ranks", read_in=(SFT_ENGINE, WORKERS))
    seed: int = key(42, "seed of the model initialisation (LoRA adapters)", ge=0, read_in=(SFT_ENGINE, ENGINE))
    ulysses_sequence_parallel_size: int = key(1, "Ulysses sequence parallel: ranks that split one packed sequence "
                                                 "(divides the number of processes and the model's heads; needs "
                                                 "model.use_remove_padding=true)", ge=1,
                                              read_in=(SFT_ENGINE, SFT_CHECKS, ENGINE))
    entropy_from_logits_with_chunking: bool = key(False, "compute the entropy in chunks of logit rows",
                                                  inert=NO_ENTROPY)
    use_torch_compile: bool = key(True, "torch.compile the decoder layers (unset on a CPU host: false)",
                                  read_in=(SFT_ENGINE, ENGINE))
    entropy_checkpointing: bool = key(False, "recompute the entropy in backward", inert=NO_ENTROPY)
    forward_only: bool = key(False, "the model is never trained",
                             unsupported="SFT trains the model; leave false")


@dataclass(frozen=True)
class SFTEngineOptim(OptimConfig):
    """``optim`` (``optim=fsdp``, verl's ``optim/fsdp.yaml``): the PPO roles' optimizer keys, verl's SFT defaults."""

    lr: float = key(1e-3, "peak learning rate", ge=0, read_in=(SFT_ENGINE, "verl/utils/fsdp_utils.py"))
    clip_grad: float = key(1.0, "max gradient norm (a non-finite norm skips the step)", ge=0,
                           read_in=(SFT_ENGINE, WORKERS))


@dataclass(frozen=True)
class SFTEngineCheckpoint(Section):
    save_contents: list = key(["model", "optimizer", "extra"], "resumable state a checkpoint holds (the Hugging Face "
                              "model directory is written every save)", items=CHECKPOINT_CONTENTS,
                              read_in=(SFT_ENGINE, SFT, CKPT))
    load_contents: list = key(["model", "optimizer", "extra"], "what resuming restores",
                              follows="checkpoint.save_contents", items=CHECKPOINT_CONTENTS, read_in=(SFT_ENGINE, CKPT))


@dataclass(frozen=True)
class SFTNPUTool(Section):
    contents: list = key([], "what to collect: npu, cpu, memory, shapes, module, stack", inert=PROFILER_OFF)
    level: str = key("level0", "collection level", choices=("level_none", "level0", "level1", "level2"),
                     inert=PROFILER_OFF)
    analysis: bool = key(True, "parse the collected data", inert=PROFILER_OFF)
    discrete: bool = key(False, "one database per task", inert=PROFILER_OFF)


@dataclass(frozen=True)
class SFTNsysTool(Section):
    discrete: bool = key(False, "one capture per task", inert=PROFILER_OFF)


@dataclass(frozen=True)
class SFTTorchTool(Section):
    step_start: int = key(0, "first mini-batch recorded", ge=0, inert=PROFILER_OFF)
    step_end: Optional[int] = key(None, "mini-batch after the last one recorded", ge=0, inert=PROFILER_OFF)
    manual_save: bool = key(True, "save the trace by hand", inert=PROFILER_OFF)


@dataclass(frozen=True)
class SFTTorchMemoryTool(Section):
    trace_alloc_max_entries: int = key(100000, "allocator events kept", ge=1, inert=PROFILER_OFF)
    stack_depth: int = key(32, "stack frames per allocator event", ge=1, inert=PROFILER_OFF)


@dataclass(frozen=True)
class SFTProfilerTools(Section):
    npu: SFTNPUTool = section(SFTNPUTool)
    nsys: SFTNsysTool = section(SFTNsysTool)
    torch: SFTTorchTool = section(SFTTorchTool)
    torch_memory: SFTTorchMemoryTool = section(SFTTorchMemoryTool)


@dataclass(frozen=True)
class SFTEngineProfiler(Section):
    """``profiler`` (verl's ``profiler/profiler.yaml``): not available in this entry point."""

    tool: Optional[str] = key("torch", "nsys | npu | torch | torch_memory", inert=PROFILER_OFF)
    enable: bool = key(False, "profile the steps of trainer.profile_interval", unsupported=NO_PROFILING)
    all_ranks: bool = key(False, "profile every rank", inert=PROFILER_OFF)
    ranks: list = key([], "ranks to profile", inert=PROFILER_OFF)
    save_path: Optional[str] = key("outputs/profile", "where results go", inert=PROFILER_OFF)
    tool_config: SFTProfilerTools = section(SFTProfilerTools)


_TRAINER_KEYS = ("default_local_dir", "default_hdfs_dir", "project_name", "experiment_name", "total_epochs",
                 "total_training_steps", "logger", "seed", "max_ckpt_to_keep", "resume_mode", "resume_from_path",
                 "nnodes")
_LAUNCHER = ("the world size comes from the launcher (torchrun --nnodes/--nproc_per_node); trainer.nnodes * "
             "trainer.n_gpus_per_node must equal it or stay at the defaults")


@dataclass(frozen=True)
class _SFTEngineTrainerOwn(Section):
    save_freq: Union[int, str] = key(-1, "checkpoint every N steps, or after_each_epoch", ge=1, also=(-1, 0),
                                     also_doc="only after the last step", read_in=(SFT_ENGINE, SFT))
    test_freq: Union[int, str] = key(-1, "validate every N steps, or after_each_epoch", ge=1, also=(-1, 0),
                                     also_doc="at the end of each epoch and after the last step",
                                     read_in=(SFT_ENGINE, SFT))
    device: str = key(
        "auto", "auto | cuda | npu | cpu (verl's yaml says cuda; auto picks it where there is one)",
        choices=("auto", "cuda", "npu", "cpu"), read_in=HERE)
    n_gpus_per_node: int = key(1, "processes per node (the launcher decides; checked against WORLD_SIZE)", ge=1,
                               unsupported=_LAUNCHER)
    profile_interval: list = key([-1, -1], "first and last step profiled", unsupported=NO_PROFILING)


SFTEngineTrainerSection = picked(SFTTrainerSection, _TRAINER_KEYS, "SFTEngineTrainerSection", _SFTEngineTrainerOwn)


@dataclass(frozen=True)
class SFTEngineTrainerConfig(Section):
    """The whole ``sft_trainer_engine.yaml``, typed."""

    data: SFTEngineData = section(SFTEngineData)
    model: SFTEngineModel = section(SFTEngineModel)
    engine: SFTEngineFSDP = section(SFTEngineFSDP)
    optim: SFTEngineOptim = section(SFTEngineOptim)
    checkpoint: SFTEngineCheckpoint = section(SFTEngineCheckpoint)
    profiler: SFTEngineProfiler = section(SFTEngineProfiler)
    trainer: SFTEngineTrainerSection = section(SFTEngineTrainerSection)
