"""Schema of ``sft_trainer.yaml`` (``python -m verl.trainer.fsdp_sft_trainer``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from verl.trainer.config_schema.engine import CHECKPOINT_CONTENTS, DTYPES, HOST_ALREADY
from verl.trainer.config_schema.places import CKPT, ENGINE, SFT, SFT_CHECKS, SFT_DATA, SFT_MULTITURN, TRACKING
from verl.trainer.config_schema.ppo import DEVICES, LOGGERS, RESUME_MODES
from verl.trainer.config_schema.spec import Section, key, section

SFT_TRUNCATIONS = ("error", "left", "right")


@dataclass(frozen=True)
class SFTMultiturn(Section):
    enable: bool = key(False, "rows are chat message lists (loss on assistant turns only)", read_in=(SFT,))
    messages_key: str = key("messages", "column holding the messages", read_in=(SFT_MULTITURN,))
    tools_key: str = key("tools", "column holding tool schemas",
                         unsupported="tool schemas in multi-turn SFT rows are not read here; leave the default")
    enable_thinking_key: str = key("enable_thinking", "column holding the thinking flag",
                                   unsupported="the thinking flag of multi-turn SFT rows is not read here; leave the "
                                               "default")


@dataclass(frozen=True)
class SFTCustomCls(Section):
    path: Optional[str] = key(None, ".py file defining your Dataset class", read_in=(SFT,))
    name: Optional[str] = key(None, "the class name", read_in=(SFT,))


@dataclass(frozen=True)
class SFTData(Section):
    train_batch_size: int = key(256, "global batch (all ranks) per optimizer step", ge=1, read_in=(SFT_CHECKS,))
    micro_batch_size: Optional[int] = key(None, "deprecated global micro batch (divided by the world size)", ge=1,
                                          read_in=(SFT_CHECKS,))
    micro_batch_size_per_gpu: int = key(4, "sequences per forward/backward on one process", ge=1,
                                        read_in=(SFT_CHECKS,))
    train_files: Union[str, list] = key("~/data/gsm8k/train.parquet", "training parquet file(s)",
                                        read_in=(SFT_CHECKS,))
    val_files: Optional[Union[str, list]] = key("~/data/gsm8k/test.parquet", "validation file(s) (null: none)",
                                                read_in=(SFT_CHECKS,))
    train_max_samples: int = key(-1, "rows of the training set used", ge=1, also=(-1,), also_doc="all",
                                 read_in=(SFT,))
    val_max_samples: int = key(-1, "rows of the validation set used", ge=1, also=(-1,), also_doc="all",
                               read_in=(SFT,))
    prompt_key: str = key("question", "single-turn prompt column", read_in=(SFT_DATA,))
    response_key: str = key("answer", "single-turn response column (the loss is on it)", read_in=(SFT_DATA,))
    prompt_dict_keys: Optional[list] = key(None, "keys into a dict-valued prompt column", read_in=(SFT_DATA,))
    response_dict_keys: Optional[list] = key(None, "keys into a dict-valued response column", read_in=(SFT_DATA,))
    multiturn: SFTMultiturn = section(SFTMultiturn)
    max_length: int = key(1024, "tokens per sequence", ge=1, read_in=(SFT_DATA,))
    truncation: str = key("error", "overlong rows: error | left | right", choices=SFT_TRUNCATIONS, read_in=(SFT_DATA,))
    balance_dp_token: bool = key(False, "balance tokens across ranks",
                                 unsupported="the loss is always normalised by the global token count here (the effect "
                                             "balance_dp_token aims at); remove the override")
    chat_template: Optional[str] = key(None, "a chat template replacing the tokenizer's", read_in=(SFT,))
    custom_cls: SFTCustomCls = section(SFTCustomCls)
    use_shm: bool = key(False, "copy the data to /dev/shm",
                        unsupported="the data is read from its path directly; leave false")


@dataclass(frozen=True)
class SFTWrapPolicy(Section):
    min_num_params: int = key(0, "size-based wrapping threshold", ge=0,
                              unsupported="FSDP2 shards each transformer layer here; size-based wrapping is not "
                                          "available; leave 0")


@dataclass(frozen=True)
class SFTFSDPConfig(Section):
    model_dtype: str = key("fp32", "dtype of the trained weights", choices=DTYPES, read_in=(SFT, ENGINE))
    dtype: Optional[str] = key(None, "compute dtype (mixed precision, fp32 master weights); null computes in "
                               "model_dtype", choices=DTYPES, read_in=(SFT, ENGINE), optional=True)
    wrap_policy: SFTWrapPolicy = section(SFTWrapPolicy)
    cpu_offload: bool = key(False, "FSDP2 CPUOffloadPolicy", read_in=(SFT, ENGINE), cpu=HOST_ALREADY)
    offload_params: bool = key(False, "same as cpu_offload", read_in=(SFT, ENGINE), cpu=HOST_ALREADY)


@dataclass(frozen=True)
class SFTModel(Section):
    partial_pretrain: str = key("~/models/gemma-1.1-7b-it", "local Hugging Face model directory", read_in=(SFT, ENGINE))
    use_shm: bool = key(False, "copy the model to /dev/shm before loading", read_in=(SFT, ENGINE))
    fsdp_config: SFTFSDPConfig = section(SFTFSDPConfig)
    external_lib: Optional[str] = key(None, "module imported first (registers custom model classes)", read_in=(SFT, ENGINE))
    enable_gradient_checkpointing: bool = key(True, "recompute activations in backward", read_in=(SFT, ENGINE))
    trust_remote_code: bool = key(False, "allow model code from the checkpoint", read_in=(SFT, ENGINE))
    lora_rank: int = key(0, "LoRA rank; > 0 trains adapters only (merged into the saved model)", ge=0,
                         read_in=(SFT, ENGINE, SFT_CHECKS))
    lora_alpha: float = key(16, "LoRA scaling numerator", gt=0, read_in=(SFT, ENGINE))
    target_modules: Union[str, list] = key("all-linear", "modules that get adapters", read_in=(SFT, ENGINE))
    use_liger: bool = key(False, "liger kernels",
                          unsupported="liger kernels need the liger-kernel GPU kernels, not available here; set "
                                      "model.use_liger=False")
    strategy: str = key("fsdp2", "training engine: fsdp | fsdp2 (both run FSDP2 here)", choices=("fsdp", "fsdp2"),
                        read_in=(ENGINE,))


@dataclass(frozen=True)
class SFTOptim(Section):
    lr: float = key(1e-5, "peak learning rate", ge=0, read_in=(SFT, ENGINE))
    betas: list = key([0.9, 0.95], "AdamW betas", read_in=(SFT, ENGINE))
    weight_decay: float = key(0.01, "decoupled weight decay", ge=0, read_in=(SFT, ENGINE))
    lr_warmup_steps_ratio: float = key(0.1, "linear warm-up as a fraction of the total steps", ge=0, le=1,
                                       read_in=(SFT, ENGINE))
    clip_grad: float = key(1.0, "max gradient norm", ge=0, read_in=(SFT, ENGINE))
    lr_scheduler: str = key("cosine", "after warm-up: cosine | constant", choices=("cosine", "constant"),
                            read_in=(SFT, ENGINE))


@dataclass(frozen=True)
class SFTCheckpoint(Section):
    save_contents: list = key(["model", "optimizer", "extra"], "what a checkpoint holds", items=CHECKPOINT_CONTENTS,
                              read_in=(SFT, ENGINE, CKPT))
    load_contents: list = key(["model", "optimizer", "extra"], "what resuming restores",
                              follows="trainer.checkpoint.save_contents", items=CHECKPOINT_CONTENTS, read_in=(CKPT,))


@dataclass(frozen=True)
class SFTTrainerSection(Section):
    default_local_dir: str = key("checkpoints/${trainer.project_name}/${trainer.experiment_name}", "checkpoint root",
                                 read_in=(SFT,))
    default_hdfs_dir: Optional[str] = key(None, "HDFS checkpoint copy",
                                          unsupported="HDFS is not supported here; set it to null and use "
                                                      "trainer.default_local_dir")
    project_name: str = key("gsm8k-sft", "tracker project", read_in=(SFT,))
    experiment_name: str = key("test", "tracker run name", read_in=(SFT,))
    total_epochs: int = key(4, "passes over the training set", ge=1, read_in=(SFT,))
    total_training_steps: Optional[int] = key(None, "steps (null: epochs x steps per epoch)", ge=1, read_in=(SFT,))
    logger: Union[str, list] = key(["console", "wandb"], "console | file | tensorboard | wandb | mlflow | swanlab | "
                                   "clearml | trackio",
                                   items=LOGGERS,
                                   read_in=(SFT, TRACKING))
    seed: int = key(1, "seed of the model init and the data order", ge=0, read_in=(SFT,))
    save_freq: int = key(-1, "checkpoint every N steps", ge=1, also=(-1, 0), also_doc="only after the last step",
                         read_in=(SFT,))
    test_freq: int = key(-1, "validate every N steps", ge=1, also=(-1, 0), also_doc="at the end of each epoch",
                         read_in=(SFT,))
    nnodes: int = key(1, "nodes (the launcher decides; checked against WORLD_SIZE)", ge=1,
                      unsupported="the world size comes from the launcher (torchrun --nnodes/--nproc_per_node); "
                                  "trainer.nnodes * trainer.n_gpus_per_node must equal it or stay at the defaults")
    n_gpus_per_node: int = key(8, "processes per node (the launcher decides; checked against WORLD_SIZE)", ge=1,
                               unsupported="the world size comes from the launcher (torchrun --nproc_per_node); "
                                           "trainer.nnodes * trainer.n_gpus_per_node must equal it or stay at the "
                                           "defaults")
    max_ckpt_to_keep: Optional[int] = key(None, "checkpoints kept (null: all)", ge=1, read_in=(SFT,))
    resume_mode: str = key("auto", "auto | disable | resume_path", choices=RESUME_MODES, read_in=(SFT,))
    resume_from_path: Optional[str] = key(None, "the global_step_N directory with resume_mode=resume_path",
                                          read_in=(SFT,))
    checkpoint: SFTCheckpoint = section(SFTCheckpoint)
    device: str = key("auto", "auto | cuda | npu | cpu", choices=DEVICES, read_in=(SFT,))


@dataclass(frozen=True)
class SFTTrainerConfig(Section):
    """The whole SFT config, typed."""

    data: SFTData = section(SFTData)
    model: SFTModel = section(SFTModel)
    optim: SFTOptim = section(SFTOptim)
    ulysses_sequence_parallel_size: int = key(1, "Ulysses sequence parallel: ranks that split one packed sequence "
                                              "(divides the number of processes and the model's heads; needs "
                                              "use_remove_padding=True)", ge=1, read_in=(SFT, SFT_CHECKS, ENGINE))
    use_remove_padding: bool = key(False, "pack each micro-batch's rows without padding (true) or keep them as "
                                   "rows (false; trailing padding columns are cut either way: same loss)",
                                   read_in=(SFT, SFT_CHECKS, ENGINE))
    trainer: SFTTrainerSection = section(SFTTrainerSection)
