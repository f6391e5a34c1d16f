"""Schema of ``critic`` (the value model for GAE) and ``reward_model`` (a learned sequence-classification RM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from verl.trainer.config_schema.actor import LOSS_AGG_MODES, ROLLOUT_N, TiledMLPConfig
from verl.trainer.config_schema.engine import (DTYPES, NO_ULYSSES, STRATEGIES, CheckpointConfig, CriticOptimConfig,
                                               FollowingMegatronConfig, FSDPConfig, MegatronConfig)
from verl.trainer.config_schema.places import (BATCH_SIZES, ENGINE, MAIN, MEGATRON, MODEL, REWARD, RUNNER, SCHEMA,
                                               TRAINER, WORKERS)
from verl.trainer.config_schema.profiler import RewardModelProfilerConfig, RoleProfilerConfig
from verl.trainer.config_schema.spec import Section, key, picked, section

EXTERNAL_LIB = "custom model classes are imported from actor_rollout_ref.model.external_lib; set that instead"
NO_CRITIC_LORA = "the critic trains all its parameters here (LoRA on the critic is not available); leave the default"
NO_GENRM = ("verl's reward-server engine: here the reward model (reward_model.model.path, a sequence classifier) is "
            "scored by its own training-engine worker, which computes the same scores, so these settings change "
            "nothing; a generative reward model served from here is not available")
NO_REWARD_LOOP = ("the reward loop is not available; rewards come from the reward manager (reward_manager.source / "
                  "reward_manager.name)")


@dataclass(frozen=True)
class CriticModelConfig(Section):
    path: str = key("~/models/deepseek-llm-7b-chat", "value model checkpoint (a causal LM; a value head is added)",
                    read_in=(WORKERS,))
    tokenizer_path: str = key("~/models/deepseek-llm-7b-chat", "tokenizer of the value model",
                              follows="actor_rollout_ref.model.path", read_in=(WORKERS,))
    external_lib: Optional[str] = key(None, "module imported first", follows="actor_rollout_ref.model.external_lib",
                                      unsupported=EXTERNAL_LIB)
    trust_remote_code: bool = key(False, "allow model code from the checkpoint",
                                  follows="actor_rollout_ref.model.trust_remote_code", read_in=(WORKERS,))
    override_config: dict = key({}, "free-form overrides of the HF model config", read_in=(WORKERS, MODEL))
    use_shm: bool = key(False, "copy the model to /dev/shm once per machine and load from there",
                        read_in=(ENGINE,))
    enable_gradient_checkpointing: bool = key(True, "recompute activations in backward", read_in=(WORKERS,))
    enable_activation_offload: bool = key(False, "offload activations to the host",
                                          unsupported="activation offload is not available; leave false")
    use_remove_padding: bool = key(False, "pack sequences without padding", read_in=(WORKERS,))
    share_prompt_prefix: bool = key(False, "rows sharing a prompt run it once, packed (value forward and critic "
                                           "update; FSDP)", read_in=(WORKERS,))
    lora_rank: int = key(0, "LoRA rank of the critic", ge=0, unsupported=NO_CRITIC_LORA)
    lora_alpha: float = key(16, "LoRA scaling of the critic", gt=0, unsupported=NO_CRITIC_LORA)
    target_modules: Union[str, list] = key("all-linear", "critic LoRA target modules", unsupported=NO_CRITIC_LORA)
    fsdp_config: FSDPConfig = section(FSDPConfig)
    tiled_mlp: TiledMLPConfig = section(TiledMLPConfig)


@dataclass(frozen=True)
class CriticConfig(Section):
    """``critic``: enabled when algorithm.adv_estimator=gae, or by critic.enable."""

    enable: Optional[bool] = key(None, "null: a critic exactly when adv_estimator=gae", read_in=(SCHEMA, TRAINER))
    strategy: str = key("fsdp", "training engine", choices=STRATEGIES, read_in=(WORKERS,))
    rollout_n: int = key(1, "responses per prompt", ge=1, follows=ROLLOUT_N, read_in=(WORKERS,))
    ppo_mini_batch_size: int = key(256, "prompts per optimizer step", ge=1,
                                   follows="actor_rollout_ref.actor.ppo_mini_batch_size", read_in=(WORKERS,))
    ppo_micro_batch_size: Optional[int] = key(None, "deprecated global micro batch", ge=1, read_in=(WORKERS, BATCH_SIZES))
    ppo_micro_batch_size_per_gpu: Optional[int] = key(None, "responses per forward/backward on one device/process",
                                                      ge=1, follows=".ppo_micro_batch_size", read_in=(WORKERS,))
    use_dynamic_bsz: bool = key(False, "pack micro-batches by token count",
                                follows="actor_rollout_ref.actor.use_dynamic_bsz", read_in=(WORKERS,))
    ppo_max_token_len_per_gpu: int = key(32768, "token budget per micro-batch", ge=1, read_in=(WORKERS,))
    forward_max_token_len_per_gpu: int = key(32768, "token budget per value forward", ge=1,
                                             follows=".ppo_max_token_len_per_gpu", read_in=(WORKERS,))
    forward_micro_batch_size: Optional[int] = key(None, "deprecated global forward micro batch", ge=1,
                                                  follows=".ppo_micro_batch_size", read_in=(WORKERS,))
    forward_micro_batch_size_per_gpu: Optional[int] = key(None, "responses per value forward", ge=1,
                                                          follows=".ppo_micro_batch_size_per_gpu", read_in=(WORKERS,))
    ppo_epochs: int = key(1, "passes over each batch", ge=1, follows="actor_rollout_ref.actor.ppo_epochs",
                          read_in=(WORKERS,))
    shuffle: bool = key(False, "shuffle mini-batches", follows="actor_rollout_ref.actor.shuffle", read_in=(WORKERS,))
    data_loader_seed: int = key(42, "seed of that shuffle", ge=0, read_in=(WORKERS,))
    cliprange_value: float = key(0.5, "value clip range", ge=0, read_in=(WORKERS,))
    loss_agg_mode: str = key("token-mean", "how token losses are averaged", choices=LOSS_AGG_MODES,
                             follows="actor_rollout_ref.actor.loss_agg_mode", read_in=(WORKERS,))
    ulysses_sequence_parallel_size: int = key(1, "Ulysses sequence-parallel group size (needs use_remove_padding)",
                                              ge=1,
                                              read_in=(WORKERS,))
    grad_clip: Optional[float] = key(1.0, "max gradient norm (null: optim.clip_grad)", ge=0, read_in=(WORKERS,))
    checkpoint: CheckpointConfig = section(CheckpointConfig)
    optim: CriticOptimConfig = section(CriticOptimConfig)
    model: CriticModelConfig = section(CriticModelConfig)
    profiler: RoleProfilerConfig = section(RoleProfilerConfig)
    megatron: FollowingMegatronConfig = section(FollowingMegatronConfig, optional=True)


@dataclass(frozen=True)
class _RMOnlyFSDPKeys(Section):
    seed: Optional[int] = key(None, "seed before loading (default 42)", ge=0, read_in=(WORKERS,), optional=True)
    model_dtype: Optional[str] = key(None, "dtype the RM is loaded in (default fp32)", choices=DTYPES,
                                     read_in=(WORKERS,), optional=True)


# reward_model.model.fsdp_config: the reward model runs forward-only in the same FSDP2 engine as the policy, sharded
# over the reward model's processes; its yaml carries these of the shared fsdp_config keys
RMFSDPConfig = picked(FSDPConfig, ("wrap_policy", "param_offload", "reshard_after_forward", "fsdp_size",
                                   "forward_prefetch"), "RMFSDPConfig", _RMOnlyFSDPKeys)


@dataclass(frozen=True)
class RMModelConfig(Section):
    input_tokenizer: Optional[str] = key(None, "the policy's tokenizer; responses are re-tokenised for the RM when "
                                         "it differs", follows="actor_rollout_ref.model.path", read_in=(WORKERS,))
    path: str = key("~/models/FsfairX-LLaMA3-RM-v0.1", "sequence-classification reward model", read_in=(WORKERS,))
    external_lib: Optional[str] = key(None, "module imported first", follows="actor_rollout_ref.model.external_lib",
                                      unsupported=EXTERNAL_LIB)
    trust_remote_code: bool = key(False, "allow model code from the checkpoint", read_in=(WORKERS,))
    use_remove_padding: bool = key(False, "score without padding (packed rows, or all-padding columns trimmed; same "
                                          "scores)", read_in=(WORKERS,))
    use_fused_kernels: bool = key(False, "fused kernels", follows="actor_rollout_ref.model.use_fused_kernels",
                                  unsupported="fused kernels are not available; use False")
    override_config: dict = key({}, "free-form overrides of the reward model's HF config", read_in=(WORKERS, MODEL))
    use_shm: bool = key(False, "copy the reward model to /dev/shm once per machine and load from there",
                        read_in=(ENGINE,))
    fsdp_config: RMFSDPConfig = section(RMFSDPConfig)


@dataclass(frozen=True)
class RMRolloutConfig(Section):
    """``reward_model.rollout``: the engine of verl's reward server (no effect here: see ``NO_GENRM``)."""

    name: str = key("???", "engine of a generative RM", inert=NO_GENRM)
    dtype: str = key("bfloat16", "engine dtype", inert=NO_GENRM)
    gpu_memory_utilization: float = key(0.5, "GPU memory fraction", gt=0, le=1, inert=NO_GENRM)
    enforce_eager: bool = key(True, "no CUDA graphs", inert=NO_GENRM)
    free_cache_engine: bool = key(True, "release the KV cache", inert=NO_GENRM)
    data_parallel_size: int = key(1, "engine data parallel size", ge=1, inert=NO_GENRM)
    expert_parallel_size: int = key(1, "engine expert parallel size", ge=1, inert=NO_GENRM)
    tensor_model_parallel_size: int = key(2, "engine tensor parallel size", ge=1, inert=NO_GENRM)
    max_num_batched_tokens: int = key(8192, "scheduler token budget", ge=1, inert=NO_GENRM)
    max_model_len: Optional[int] = key(None, "context length", ge=1, inert=NO_GENRM)
    max_num_seqs: int = key(1024, "concurrent sequences", ge=1, inert=NO_GENRM)
    load_format: str = key("auto", "weight loading", inert=NO_GENRM)
    limit_images: Optional[int] = key(None, "images per prompt", ge=0, inert=NO_GENRM)
    enable_chunked_prefill: bool = key(True, "chunked prefill", inert=NO_GENRM)
    enable_prefix_caching: bool = key(True, "prefix caching", inert=NO_GENRM)
    disable_log_stats: bool = key(True, "silence engine stats", inert=NO_GENRM)
    prompt_length: int = key(2048, "prompt budget", ge=1, inert=NO_GENRM)
    response_length: int = key(2048, "max new tokens", ge=1, inert=NO_GENRM)
    cudagraph_capture_sizes: Optional[list] = key(None, "CUDA graph batch sizes", inert=NO_GENRM)
    engine_kwargs: dict = key({}, "free-form engine arguments", inert=NO_GENRM)
    skip_tokenizer_init: bool = key(False, "start the engine without a tokenizer", inert=NO_GENRM)


CODE_SCORER = "verl/utils/reward_score/sandbox_fusion.py"


@dataclass(frozen=True)
class SandboxFusionConfig(Section):
    """``reward_model.sandbox_fusion``: where the code data sources (codecontests, apps, codeforces, taco) run the
    response's program on the row's test cases."""

    url: Optional[str] = key(None, "a Sandbox Fusion server's run_code endpoint, http(s)://... (null: each "
                                   "program runs in a local isolated subprocess)", read_in=(REWARD, CODE_SCORER))
    max_concurrent: int = key(64, "requests to the server at a time (per scoring process)", ge=1,
                              read_in=(REWARD, CODE_SCORER))
    memory_limit_mb: int = key(1024, "memory limit per program run (server and local)", ge=1,
                               read_in=(REWARD, CODE_SCORER))


ACTOR_MEGATRON = "actor_rollout_ref.actor.megatron"


@dataclass(frozen=True)
class RewardModelMegatronConfig(MegatronConfig):
    """``reward_model.megatron`` (verl's megatron_reward_model.yaml): the reward model's own parallel sizes. It runs
    forward passes only, so there is no optimizer state to shard; the seed, the transformer overrides and the
    converter switches follow the actor's unless set."""

    use_distributed_optimizer: bool = key(False, "shard the optimizer state (the reward model keeps none)",
                                          read_in=(MEGATRON,))
    seed: int = key(42, "Megatron seed", ge=0, follows=f"{ACTOR_MEGATRON}.seed", read_in=(MEGATRON,))
    override_transformer_config: dict = key({}, "megatron-core TransformerConfig fields applied over the engine's "
                                                "(as the actor's)",
                                            follows=f"{ACTOR_MEGATRON}.override_transformer_config",
                                            read_in=(MEGATRON, "verl/models/mcore/model.py"))
    use_mbridge: bool = key(False, "load HF weights through mbridge (verl); the same weights load either way",
                            follows=f"{ACTOR_MEGATRON}.use_mbridge", read_in=(MEGATRON,))
    vanilla_mbridge: bool = key(True, "mbridge variant (verl); the same weights load either way",
                                follows=f"{ACTOR_MEGATRON}.vanilla_mbridge", read_in=(MEGATRON,))


@dataclass(frozen=True)
class RewardModelConfig(Section):
    """``reward_model``: off by default (rule-based rewards come from the reward manager)."""

    enable: bool = key(False, "score responses with a learned reward model", read_in=(SCHEMA, MAIN))
    enable_resource_pool: bool = key(False, "the RM gets its own pool of n_gpus_per_node x nnodes", read_in=(MAIN,))
    n_gpus_per_node: int = key(8, "devices (CPU: processes) per node of the RM pool", ge=1, read_in=(MAIN,))
    nnodes: int = key(0, "nodes of the RM pool", ge=0, read_in=(MAIN,))
    strategy: str = key("fsdp", "engine of the RM (megatron: the sequence classifier on the Megatron engine, sizes in "
                                "reward_model.megatron)",
                        choices=STRATEGIES, read_in=(RUNNER,))
    micro_batch_size: Optional[int] = key(None, "deprecated global micro batch", ge=1, read_in=(WORKERS,))
    micro_batch_size_per_gpu: Optional[int] = key(None, "sequences per RM forward on one device/process", ge=1,
                                                  read_in=(WORKERS,))
    max_length: Optional[int] = key(None, "max RM input length when re-tokenising", ge=1, read_in=(WORKERS,))
    use_dynamic_bsz: bool = key(False, "pack by token count", follows="critic.use_dynamic_bsz",
                                unsupported="the reward model scores fixed micro-batches "
                                            "(reward_model.micro_batch_size_per_gpu); leave it following the critic")
    forward_max_token_len_per_gpu: int = key(32768, "token budget per forward", ge=1,
                                             follows="critic.forward_max_token_len_per_gpu",
                                             unsupported="the reward model scores fixed micro-batches; leave it "
                                                         "following the critic")
    reward_manager: str = key("naive", "reward manager: naive | batch | prime | dapo (or a registered name)",
                              read_in=(REWARD,))
    reward_loop_source: str = key("register", "reward-loop class source", unsupported=NO_REWARD_LOOP)
    reward_loop_module_path: Optional[str] = key(None, "reward-loop module", unsupported=NO_REWARD_LOOP)
    reward_loop_class_name: Optional[str] = key(None, "reward-loop class", unsupported=NO_REWARD_LOOP)
    launch_reward_fn_async: bool = key(False, "score in a Ray task overlapping the log-prob passes", read_in=(TRAINER,))
    ulysses_sequence_parallel_size: int = key(1, "Ulysses group size", ge=1, unsupported=NO_ULYSSES)
    use_reward_loop: bool = key(True, "verl's switch between its reward loop and its reward-model worker",
                                inert="for either value rewards come from the reward manager and the reward-model "
                                      "worker (verl's use_reward_loop=False path)")
    num_workers: int = key(1, "Ray actors that run the reward function on slices of each batch at once (1: the "
                              "trainer scores the batch itself)", ge=1, read_in=(RUNNER, REWARD))
    reward_kwargs: dict = key({}, "free-form keyword arguments of the reward manager", read_in=(MAIN, REWARD))
    overlong_buffer: Optional[dict] = key(None, "DAPO overlong penalty (recipe spelling; free-form)", read_in=(REWARD,),
                                          optional=True)
    sandbox_fusion: SandboxFusionConfig = section(SandboxFusionConfig)
    # verl: reward_model/megatron_reward_model.yaml (its own sizes, not the actor's); strategy=megatron only
    megatron: RewardModelMegatronConfig = section(RewardModelMegatronConfig, optional=True)
    model: RMModelConfig = section(RMModelConfig)
    rollout: RMRolloutConfig = section(RMRolloutConfig)
    profiler: RewardModelProfilerConfig = section(RewardModelProfilerConfig)
