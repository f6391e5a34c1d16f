"""Schema of ``ppo_trainer.yaml`` (and ``ppo_megatron_trainer.yaml``): data, algorithm, trainer, reward plumbing and
the root :class:`PPOTrainerConfig` that ties the sections together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from verl.trainer.config_schema.actor import ActorConfig, ModelConfig, RefConfig
from verl.trainer.config_schema.critic import CriticConfig, RewardModelConfig
from verl.trainer.config_schema.places import (ADV, DAPO, KL, MAIN, PF_PPO, REWARD, RL_DATA, ROLLOUT_CORR, RUNNER,
                                               TRACKING, CHECKPOINTING, TRAINER, TRAINER_DATA, VALIDATION,
                                               WORKER_GROUPS, WORKERS, RECIPE)
from verl.trainer.config_schema.profiler import GlobalProfilerConfig
from verl.trainer.config_schema.rollout import RolloutConfig
from verl.trainer.config_schema.spec import Section, build, key, section

TRUNCATIONS = ("error", "left", "right", "middle")
LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow", "swanlab", "clearml", "trackio")
RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cuda", "npu", "cpu")
KL_CTRL_TYPES = ("fixed", "adaptive")
IS_LEVELS = (None, "token", "sequence")  # verl.trainer.ppo.rollout_corr.IS_LEVELS (a test keeps them equal)
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")  # verl.trainer.ppo.rollout_corr.BYPASS_LOSS_TYPES (a test keeps them equal)
REWEIGHT_METHODS = ("pow", "max_min", "max_random")  # verl.trainer.ppo.pf_ppo.REWEIGHT_METHODS (same)
NO_MULTIMODAL = "videos are not supported (images are: data.image_key); leave the default"
NO_RS = "rejection sampling is not available; leave it null"
DAPO_REWARD = "verl/workers/reward_manager/dapo.py"
PREFERENCE_DATA = "verl/trainer/preference/dataset.py"  # the preference recipes' datasets


@dataclass(frozen=True)
class CustomCls(Section):
    path: Optional[str] = key(None, ".py file defining your Dataset class", read_in=(RL_DATA,))
    name: Optional[str] = key(None, "the class name", read_in=(RL_DATA,))


@dataclass(frozen=True)
class Sampler(Section):
    class_path: Optional[str] = key(None, ".py file defining your sampler (curriculum)", read_in=(RL_DATA,))
    class_name: Optional[str] = key(None, "the sampler class name", read_in=(RL_DATA,))


@dataclass(frozen=True)
class DataConfig(Section):
    """``data``: parquet files with verl's schema (data_source, prompt, ability, reward_model, extra_info)."""

    tokenizer: Optional[str] = key(None, "a tokenizer for the data",
                                   unsupported="the tokenizer comes from actor_rollout_ref.model.tokenizer_path (or "
                                               "model.path); leave null")
    train_files: Union[str, list] = key("~/data/rlhf/gsm8k/train.parquet", "training parquet file(s)",
                                        read_in=(MAIN,))
    val_files: Union[str, list] = key("~/data/rlhf/gsm8k/test.parquet", "validation parquet file(s)", read_in=(MAIN,))
    train_max_samples: int = key(-1, "rows of the training set used", ge=1, also=(-1,), also_doc="all",
                                 read_in=(RL_DATA,))
    val_max_samples: int = key(-1, "rows of the validation set used", ge=1, also=(-1,), also_doc="all",
                               read_in=(RL_DATA,))
    prompt_key: str = key("prompt", "column holding the chat prompt", read_in=(RL_DATA,))
    reward_fn_key: str = key("data_source", "column that selects the scoring function", read_in=(REWARD,))
    max_prompt_length: int = key(512, "prompt tokens (left-padded to this length)", ge=1, read_in=(RL_DATA,))
    max_response_length: int = key(512, "response tokens (rollout.response_length follows it)", ge=1,
                                   read_in=(REWARD,))
    train_batch_size: int = key(1024, "prompts per step (each sampled rollout.n times)", ge=1,
                                 read_in=(TRAINER_DATA,))
    gen_batch_size: Optional[int] = key(None, "prompts per generation round of DAPO's dynamic sampling "
                                        "(python -m recipe.dapo.main_dapo)", ge=1, follows="data.train_batch_size",
                                        read_in=(DAPO,), optional=True)
    val_batch_size: Optional[int] = key(None, "validation prompts per batch (null: all at once)", ge=1,
                                        read_in=(TRAINER_DATA,))
    return_raw_input_ids: bool = key(False, "also return unpadded prompt ids",
                                     unsupported="not available; the reward model re-tokenises from raw_prompt "
                                                 "instead; leave false")
    return_raw_chat: bool = key(True, "keep the chat messages as raw_prompt", read_in=(RL_DATA,))
    return_full_prompt: bool = key(False, "keep the rendered prompt string", read_in=(RL_DATA,))
    shuffle: bool = key(True, "shuffle the training set", read_in=(TRAINER_DATA,))
    seed: Optional[int] = key(None, "sampler seed (null: 1)", ge=0, read_in=(TRAINER,))
    dataloader_num_workers: int = key(8, "DataLoader worker processes", ge=0, read_in=(TRAINER_DATA,),
                                      cpu="no effect (data is loaded in the main process on CPU)")
    validation_shuffle: bool = key(False, "shuffle the validation set", read_in=(TRAINER_DATA,))
    filter_overlong_prompts: bool = key(False, "drop prompts longer than max_prompt_length", read_in=(RL_DATA,))
    filter_overlong_prompts_workers: int = key(1, "processes for that filter (forked; the kept rows are the same)", ge=1,
                                               read_in=(RL_DATA,))
    tool_config_path: Optional[str] = key(None, "tools whose schemas the overlong-prompt filter renders into the "
                                                "chat template, as the tool agent does",
                                          follows="actor_rollout_ref.rollout.multi_turn.tool_config_path",
                                          read_in=(RL_DATA,))
    truncation: str = key("error", "overlong prompts: error | left | right | middle", choices=TRUNCATIONS,
                          read_in=(RL_DATA,))
    trust_remote_code: bool = key(False, "allow tokenizer code from the checkpoint", read_in=(RUNNER,))
    image_key: str = key("images", "column of images (with a vision-language model)", read_in=(RL_DATA,))
    video_key: str = key("videos", "column of videos", unsupported=NO_MULTIMODAL)
    return_multi_modal_inputs: bool = key(True, "return processor outputs (false: images reach the rollout only)",
                                          read_in=(RL_DATA,))
    use_shm: bool = key(False, "copy the data to /dev/shm",
                        unsupported="the data is read from its path directly; leave false")
    apply_chat_template_kwargs: dict = key({}, "free-form chat-template arguments (e.g. enable_thinking)",
                                           read_in=(RL_DATA,))
    chat_template: Optional[str] = key(None, "a chat template replacing the tokenizer's", read_in=(RL_DATA,),
                                       optional=True)
    custom_cls: CustomCls = section(CustomCls)
    sampler: Sampler = section(Sampler)


@dataclass(frozen=True)
class PreferenceColumns(Section):
    """The keys the preference recipes (``recipe/dpo``, ``recipe/reward_model``, ``recipe/spin``, ...) add to the
    ``data`` section of ``ppo_trainer.yaml``, which their yamls extend: the columns of preference rows and how
    their prompts are rendered."""

    chosen_key: str = key("chosen", "column of the preferred response (paired rows)", read_in=(PREFERENCE_DATA,))
    rejected_key: str = key("rejected", "column of the other response (paired rows)", read_in=(PREFERENCE_DATA,))
    completion_key: str = key("completion", "column of the completion (unpaired rows, KTO)",
                              read_in=(PREFERENCE_DATA,))
    label_key: str = key("label", "column of the label, true = desirable (unpaired rows, KTO)",
                         read_in=(PREFERENCE_DATA,))
    response_key: str = key("response", "column of the target response (self-play rows, SPIN)",
                            read_in=(PREFERENCE_DATA,))
    apply_chat_template: bool = key(True, "render a string prompt as one user turn with the chat template (false: "
                                    "the string as it is)", read_in=(PREFERENCE_DATA,))


@dataclass(frozen=True)
class ActorRolloutRefConfig(Section):
    hybrid_engine: bool = key(True, "actor and rollout share processes",
                              unsupported="actor and rollout always share processes here; leave true")
    nccl_timeout: int = key(600, "process-group timeout in seconds: a collective (gather, all-reduce) that waits "
                                 "longer fails instead of hanging", gt=0, read_in=(WORKERS,))
    model: ModelConfig = section(ModelConfig)
    actor: ActorConfig = section(ActorConfig)
    ref: RefConfig = section(RefConfig)
    rollout: RolloutConfig = section(RolloutConfig)


@dataclass(frozen=True)
class RewardManagerModule(Section):
    path: Optional[str] = key(None, ".py file of a custom reward manager (source=importlib)", read_in=(REWARD,))
    name: str = key("custom_reward_manager", "its class name", read_in=(REWARD,))


@dataclass(frozen=True)
class RewardManagerConfig(Section):
    source: str = key("register", "register (by name) | importlib (from module.path)", choices=("register", "importlib"),
                      read_in=(REWARD,))
    name: str = key("naive", "registered reward manager", follows="reward_model.reward_manager", read_in=(REWARD,))
    module: RewardManagerModule = section(RewardManagerModule)


@dataclass(frozen=True)
class CustomRewardFunction(Section):
    path: Optional[str] = key(None, ".py file with compute_score(data_source, solution_str, ground_truth, "
                              "extra_info=None)", read_in=(REWARD,))
    name: str = key("compute_score", "the function's name", read_in=(REWARD,))
    reward_kwargs: Optional[dict] = key(None, "free-form keyword arguments bound to the function", read_in=(REWARD,),
                                        optional=True)


@dataclass(frozen=True)
class KLCtrlConfig(Section):
    type: str = key("fixed", "KL coefficient controller: fixed | adaptive", choices=KL_CTRL_TYPES, read_in=(KL,))
    kl_coef: float = key(0.001, "(initial) KL coefficient", ge=0, read_in=(KL,))
    horizon: int = key(10000, "adaptive controller horizon", ge=1, read_in=(KL,))
    target_kl: float = key(0.1, "adaptive controller target", gt=0, read_in=(KL,))


@dataclass(frozen=True)
class PFPPOConfig(Section):
    reweight_method: str = key("pow", "pow | max_min | max_random", choices=REWEIGHT_METHODS, read_in=(PF_PPO,))
    weight_pow: float = key(2.0, "exponent of |score| with pow (0: uniform)", ge=0, read_in=(PF_PPO,))


@dataclass(frozen=True)
class RolloutCorrectionConfig(Section):
    bypass_mode: bool = key(False, "old_log_probs = the rollout's (the trainer's log-prob pass is skipped)",
                            read_in=(TRAINER, ROLLOUT_CORR))
    rollout_is: Optional[str] = key(None, "truncated IS weights pi_old/pi_rollout: null | token | sequence",
                                    choices=IS_LEVELS, read_in=(TRAINER, ROLLOUT_CORR))
    rollout_is_threshold: float = key(2.0, "upper truncation of the IS weights", gt=0, read_in=(TRAINER, ROLLOUT_CORR))
    rollout_is_batch_normalize: bool = key(False, "divide the truncated IS weights by their mean over the batch's "
                                           "valid tokens (token) or responses (sequence), so they average 1 "
                                           "(with loss_type=reinforce: over each micro-batch)",
                                           read_in=(TRAINER, ROLLOUT_CORR))
    loss_type: str = key("ppo_clip", "the policy loss in bypass mode: ppo_clip (the actor's PPO loss, ratio "
                         "pi_theta/pi_rollout) | reinforce (-w * A * log pi_theta, w = pi_theta/pi_rollout detached and "
                         "truncated at rollout_is_threshold at the rollout_is level; w = 1 when rollout_is is null)",
                         choices=BYPASS_LOSS_TYPES, read_in=(TRAINER, ROLLOUT_CORR))
    rollout_rs: Optional[str] = key(None, "rejection sampling level", unsupported=NO_RS)
    rollout_rs_threshold: Optional[float] = key(None, "rejection upper threshold", unsupported=NO_RS)
    rollout_rs_threshold_lower: Optional[float] = key(None, "rejection lower threshold", unsupported=NO_RS)
    rollout_token_veto_threshold: Optional[float] = key(None, "per-token veto",
                                                        unsupported="the token veto is not available; leave it null")
    use_policy_gradient: bool = key(False, "pure policy-gradient loss with IS",
                                    unsupported="the pure policy-gradient loss is not available; use False (PPO loss)")


@dataclass(frozen=True)
class FilterGroupsConfig(Section):
    """DAPO's dynamic sampling (``python -m recipe.dapo.main_dapo``; main_ppo accepts only ``enable=False``)."""

    enable: bool = key(False, "drop prompt groups whose metric is equal for all responses; generate until the "
                       "batch is full", read_in=(DAPO,))
    metric: Optional[str] = key(None, "per-response value compared within a prompt's group", read_in=(DAPO,),
                                choices=(None, "acc", "score", "seq_reward", "seq_final_reward"))
    max_num_gen_batches: int = key(0, "generation rounds per step before stopping with an error (<= 0: no limit)",
                                   read_in=(DAPO,))


@dataclass(frozen=True)
class OverlongBufferConfig(Section):
    """DAPO's soft overlong punishment, read by the ``dapo`` reward manager: ``reward_model.overlong_buffer``
    (recipe/dapo's yaml) or verl's ``reward_model.reward_kwargs.overlong_buffer_cfg``."""

    enable: bool = key(False, "penalise responses that reach into the last `len` tokens before the maximum length",
                       read_in=(DAPO_REWARD,))
    len: int = key(0, "tokens before data.max_response_length over which the penalty ramps up", ge=0,
                   read_in=(DAPO_REWARD,))
    penalty_factor: float = key(0.0, "the penalty at the maximum length", ge=0, read_in=(DAPO_REWARD,))
    log: bool = key(False, "report overlong_reward and overlong per sample", read_in=(DAPO_REWARD,))


@dataclass(frozen=True)
class AlgorithmConfig(Section):
    """``algorithm``: advantage estimator and KL."""

    gamma: float = key(1.0, "discount factor", ge=0, le=1, read_in=(ADV,))
    lam: float = key(1.0, "GAE lambda", ge=0, le=1, read_in=(TRAINER,))
    adv_estimator: str = key("gae", "advantage estimator (a registered name)", read_in=(TRAINER, ADV))
    norm_adv_by_std_in_grpo: bool = key(True, "divide GRPO advantages by the group std (false: Dr.GRPO)",
                                        read_in=(TRAINER, ADV))
    use_kl_in_reward: bool = key(False, "KL penalty inside the reward (needs the reference policy)",
                                 read_in=(TRAINER,))
    kl_penalty: str = key("kl", "KL estimator in the reward: kl|k1 | abs | mse|k2 | low_var_kl|k3 | full",
                          read_in=(TRAINER, KL))
    kl_ctrl: KLCtrlConfig = section(KLCtrlConfig)
    use_pf_ppo: bool = key(False, "PF-PPO: resample by sequence score (gae only)", read_in=(TRAINER,))
    pf_ppo: PFPPOConfig = section(PFPPOConfig)
    rollout_correction: RolloutCorrectionConfig = section(RolloutCorrectionConfig)
    filter_groups: FilterGroupsConfig = section(FilterGroupsConfig, optional=True)


@dataclass(frozen=True)
class TrainerConfig(Section):
    """``trainer``: loop length, logging, validation, checkpoints, placement."""

    device: str = key("auto", "auto (cuda, then npu, then cpu) | cuda | npu | cpu", choices=DEVICES,
                      read_in=(TRAINER, MAIN))
    nnodes: int = key(1, "nodes", ge=1, read_in=(MAIN,))
    n_gpus_per_node: int = key(8, "devices per node (CPU: worker processes per node)", ge=1, read_in=(MAIN,))
    balance_batch: bool = key(True, "reorder samples so ranks get similar token counts", read_in=(TRAINER,))
    total_epochs: int = key(30, "passes over the training set", ge=1, read_in=(TRAINER_DATA,))
    total_training_steps: Optional[int] = key(None, "steps (null: epochs x batches)", ge=1, read_in=(TRAINER,))
    project_name: str = key("verl_examples", "tracker project", read_in=(TRAINER,))
    experiment_name: str = key("gsm8k", "tracker run name", read_in=(TRAINER,))
    logger: Union[str, list] = key(["console", "wandb"], "console | file | tensorboard | wandb | mlflow | swanlab | "
                                   "clearml | trackio",
                                   items=LOGGERS,
                                   read_in=(TRAINER, TRACKING))
    log_val_generations: int = key(0, "validation samples shown per validation", ge=0, read_in=(VALIDATION,))
    rollout_data_dir: Optional[str] = key(None, "write each step's samples as JSONL here", read_in=(VALIDATION,))
    validation_data_dir: Optional[str] = key(None, "write each validation's samples as JSONL here",
                                             read_in=(VALIDATION,))
    val_before_train: bool = key(True, "validate before the first step", read_in=(TRAINER,))
    val_only: bool = key(False, "validate and stop", read_in=(TRAINER,))
    test_freq: int = key(-1, "validate every N steps and at the last step", ge=1, also=(-1, 0), also_doc="never",
                         read_in=(TRAINER,))
    save_freq: int = key(-1, "checkpoint every N steps and at the last step", ge=1, also=(-1, 0), also_doc="never",
                         read_in=(TRAINER,))
    resume_mode: str = key("auto", "auto (latest under default_local_dir) | disable | resume_path", choices=RESUME_MODES,
                           read_in=(TRAINER,))
    resume_from_path: Optional[str] = key(None, ".../global_step_N with resume_mode=resume_path",
                                          read_in=(CHECKPOINTING,))
    del_local_ckpt_after_load: bool = key(False, "delete the checkpoint after resuming from it",
                                         read_in=(CHECKPOINTING,))
    critic_warmup: int = key(0, "steps that train only the critic", ge=0, read_in=(TRAINER,))
    default_local_dir: str = key("checkpoints/${trainer.project_name}/${trainer.experiment_name}",
                                 "checkpoint root", read_in=(TRAINER, CHECKPOINTING))
    default_hdfs_dir: Optional[str] = key(None, "HDFS checkpoint copy", unsupported="HDFS is not supported; leave it "
                                          "null and use trainer.default_local_dir")
    max_actor_ckpt_to_keep: Optional[int] = key(None, "actor checkpoints kept (null: all)", ge=1,
                                              read_in=(CHECKPOINTING,))
    max_critic_ckpt_to_keep: Optional[int] = key(None, "critic checkpoints kept (null: all)", ge=1,
                                               read_in=(CHECKPOINTING,))
    ray_wait_register_center_timeout: int = key(300, "seconds to wait for the workers to register", gt=0,
                                                read_in=(WORKER_GROUPS,))
    use_legacy_worker_impl: str = key("auto", "verl's legacy/new worker switch (one set of engine-based workers "
                                      "serves every value)", choices=("auto", "enable", "disable"),
                                      read_in=(RUNNER,))
    esi_redundant_time: float = key(0, "elastic-instance checkpoint margin (seconds)", ge=0,
                                    unsupported="elastic (ESI) checkpointing is not available; leave 0")


@dataclass(frozen=True)
class RecipeTrainerConfig(TrainerConfig):
    """``trainer`` of the recipe drivers (DPO, SimPO, the reward model, GKD, SPIN, online DPO / SPPO, rejection
    sampling): the PPO trainer's keys plus the seed of their data order."""

    seed: int = key(0, "seed of the prompt / pair order (and of sampling, where the recipe samples)", ge=0,
                    read_in=(RECIPE,))


@dataclass(frozen=True)
class RayInitConfig(Section):
    num_cpus: Optional[int] = key(None, "Ray CPUs (null: enough for every worker process)", ge=1, read_in=(MAIN,))
    timeline_json_file: Optional[str] = key(None, "write a Ray timeline here",
                                            unsupported="Ray timelines are not written here; leave null")


@dataclass(frozen=True)
class RayKwargsConfig(Section):
    ray_init: dict = key({}, "free-form ray.init arguments", read_in=(MAIN,))


@dataclass(frozen=True)
class PPOTrainerConfig(Section):
    """The whole PPO config, typed: ``build(PPOTrainerConfig, config)`` after validation."""

    data: DataConfig = section(DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig)
    critic: CriticConfig = section(CriticConfig)
    reward_model: RewardModelConfig = section(RewardModelConfig)
    reward_manager: RewardManagerConfig = section(RewardManagerConfig)
    custom_reward_function: CustomRewardFunction = section(CustomRewardFunction)
    algorithm: AlgorithmConfig = section(AlgorithmConfig)
    trainer: TrainerConfig = section(TrainerConfig)
    ray_init: RayInitConfig = section(RayInitConfig)
    ray_kwargs: RayKwargsConfig = section(RayKwargsConfig)
    global_profiler: GlobalProfilerConfig = section(GlobalProfilerConfig)


def as_ppo_config(config: Any, typed: Optional[PPOTrainerConfig] = None) -> PPOTrainerConfig:
    """The PPO config's typed view: ``typed`` when the caller already has it, ``config`` itself when it is one,
    else built from ``config`` (a DictConfig or a mapping; keys it leaves out take the schema's defaults)."""
    if typed is not None:
        return typed
    return config if isinstance(config, PPOTrainerConfig) else build(PPOTrainerConfig, config)


def need_critic(config: Any) -> bool:
    """verl's rule: ``critic.enable`` if set, else a critic exactly when the estimator is GAE. ``config``: the
    typed config, or a Hydra config (its typed view is built here)."""
    typed = as_ppo_config(config)
    if typed.critic.enable is not None:
        return bool(typed.critic.enable)
    return typed.algorithm.adv_estimator == "gae"
