"""verl.workers.config: verl 0.7's typed config classes, built on the config schema's sections.

verl's public names import; every field of verl's classes is on ours; ``omega_conf_to_dataclass`` turns the shipped
yamls' sections into them with the yaml's values; unsupported fields are refused by name unless at their default;
instances are frozen.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import verl.workers.config as wc
from verl.trainer.config_schema import actor as schema_actor
from verl.trainer.config_schema.spec import specs
from verl.utils.config import ConfigError, omega_conf_to_dataclass

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "verl" / "trainer" / "config")

# verl v0.7.0: verl/workers/config/__init__.py's __all__ (the union of its modules' __all__)
VERL_ALL = (
    "PolicyLossConfig", "RouterReplayConfig", "ActorConfig", "FSDPActorConfig", "McoreActorConfig",
    "CriticConfig", "FSDPCriticConfig", "McoreCriticConfig", "FSDPCriticModelCfg",
    "SandboxFusionConfig", "RewardModelConfig",
    "FSDPEngineConfig", "McoreEngineConfig", "TrainingWorkerConfig", "VeOmniEngineConfig",
    "OptimizerConfig", "FSDPOptimizerConfig", "McoreOptimizerConfig", "build_optimizer", "VeOmniOptimizerConfig",
    "SamplingConfig", "MultiTurnConfig", "CustomAsyncServerConfig", "AgentLoopConfig", "TraceConfig", "ServerConfig",
    "PrometheusConfig", "RolloutConfig",
    "HFModelConfig",
)

# verl v0.7.0: the dataclass fields of each class (inherited ones included, private ones left out), read once from
# verl/workers/config/*.py, verl/base_config.py and verl/trainer/config/config.py
VERL_FIELDS = {
    "ActorConfig": ('strategy', 'ppo_mini_batch_size', 'ppo_micro_batch_size', 'ppo_micro_batch_size_per_gpu',
        'ppo_infer_micro_batch_size_per_gpu', 'use_dynamic_bsz', 'ppo_max_token_len_per_gpu',
        'ppo_infer_max_token_len_per_gpu', 'clip_ratio', 'clip_ratio_low', 'clip_ratio_high', 'freeze_vision_tower',
        'policy_loss', 'clip_ratio_c', 'loss_agg_mode', 'loss_scale_factor', 'entropy_coeff', 'tau_pos', 'tau_neg',
        'calculate_entropy', 'use_kl_loss', 'use_torch_compile', 'kl_loss_coef', 'kl_loss_type', 'ppo_epochs',
        'shuffle', 'data_loader_seed', 'checkpoint', 'optim', 'use_fused_kernels', 'profiler', 'engine',
        'rollout_n', 'model_config', 'router_replay', 'global_batch_info',),
    "FSDPActorConfig": ('strategy', 'ppo_mini_batch_size', 'ppo_micro_batch_size', 'ppo_micro_batch_size_per_gpu',
        'ppo_infer_micro_batch_size_per_gpu', 'use_dynamic_bsz', 'ppo_max_token_len_per_gpu',
        'ppo_infer_max_token_len_per_gpu', 'clip_ratio', 'clip_ratio_low', 'clip_ratio_high', 'freeze_vision_tower',
        'policy_loss', 'clip_ratio_c', 'loss_agg_mode', 'loss_scale_factor', 'entropy_coeff', 'tau_pos', 'tau_neg',
        'calculate_entropy', 'use_kl_loss', 'use_torch_compile', 'kl_loss_coef', 'kl_loss_type', 'ppo_epochs',
        'shuffle', 'data_loader_seed', 'checkpoint', 'optim', 'use_fused_kernels', 'profiler', 'engine',
        'rollout_n', 'model_config', 'router_replay', 'global_batch_info', 'grad_clip',
        'ulysses_sequence_parallel_size', 'entropy_from_logits_with_chunking', 'entropy_checkpointing',
        'fsdp_config', 'use_remove_padding', 'use_rollout_log_probs',),
    "McoreActorConfig": ('strategy', 'ppo_mini_batch_size', 'ppo_micro_batch_size', 'ppo_micro_batch_size_per_gpu',
        'ppo_infer_micro_batch_size_per_gpu', 'use_dynamic_bsz', 'ppo_max_token_len_per_gpu',
        'ppo_infer_max_token_len_per_gpu', 'clip_ratio', 'clip_ratio_low', 'clip_ratio_high', 'freeze_vision_tower',
        'policy_loss', 'clip_ratio_c', 'loss_agg_mode', 'loss_scale_factor', 'entropy_coeff', 'tau_pos', 'tau_neg',
        'calculate_entropy', 'use_kl_loss', 'use_torch_compile', 'kl_loss_coef', 'kl_loss_type', 'ppo_epochs',
        'shuffle', 'data_loader_seed', 'checkpoint', 'optim', 'use_fused_kernels', 'profiler', 'engine',
        'rollout_n', 'model_config', 'router_replay', 'global_batch_info', 'load_weight', 'megatron', 'profile',
        'use_rollout_log_probs',),
    "PolicyLossConfig": ('loss_mode', 'clip_cov_ratio', 'clip_cov_lb', 'clip_cov_ub', 'kl_cov_ratio', 'ppo_kl_coef',),
    "RouterReplayConfig": ('mode', 'record_file', 'replay_file',),
    "CriticConfig": ('strategy', 'ppo_micro_batch_size_per_gpu', 'enable', 'rollout_n', 'ppo_mini_batch_size',
        'use_dynamic_bsz', 'ppo_max_token_len_per_gpu', 'forward_max_token_len_per_gpu',
        'ppo_infer_micro_batch_size_per_gpu', 'ppo_infer_max_token_len_per_gpu', 'ppo_epochs', 'data_loader_seed',
        'shuffle', 'cliprange_value', 'loss_agg_mode', 'ppo_micro_batch_size', 'engine', 'optim', 'model',
        'model_config', 'checkpoint', 'profiler',),
    "FSDPCriticConfig": ('strategy', 'ppo_micro_batch_size_per_gpu', 'enable', 'rollout_n', 'ppo_mini_batch_size',
        'use_dynamic_bsz', 'ppo_max_token_len_per_gpu', 'forward_max_token_len_per_gpu',
        'ppo_infer_micro_batch_size_per_gpu', 'ppo_infer_max_token_len_per_gpu', 'ppo_epochs', 'data_loader_seed',
        'shuffle', 'cliprange_value', 'loss_agg_mode', 'ppo_micro_batch_size', 'engine', 'optim', 'model',
        'model_config', 'checkpoint', 'profiler', 'forward_micro_batch_size', 'forward_micro_batch_size_per_gpu',
        'ulysses_sequence_parallel_size', 'grad_clip',),
    "McoreCriticConfig": ('strategy', 'ppo_micro_batch_size_per_gpu', 'enable', 'rollout_n', 'ppo_mini_batch_size',
        'use_dynamic_bsz', 'ppo_max_token_len_per_gpu', 'forward_max_token_len_per_gpu',
        'ppo_infer_micro_batch_size_per_gpu', 'ppo_infer_max_token_len_per_gpu', 'ppo_epochs', 'data_loader_seed',
        'shuffle', 'cliprange_value', 'loss_agg_mode', 'ppo_micro_batch_size', 'engine', 'optim', 'model',
        'model_config', 'checkpoint', 'profiler', 'nccl_timeout', 'megatron', 'load_weight',),
    "FSDPCriticModelCfg": ('path', 'tokenizer_path', 'override_config', 'external_lib', 'trust_remote_code', 'lora',
        'use_shm', 'enable_activation_offload', 'use_remove_padding', 'enable_gradient_checkpointing',
        'fsdp_config', 'lora_rank', 'lora_alpha', 'target_modules', 'tiled_mlp',),
    "FSDPEngineConfig": ('param_offload', 'optimizer_offload', 'grad_offload', 'forward_only', 'strategy', 'dtype',
        'use_dynamic_bsz', 'max_token_len_per_gpu', 'micro_batch_size_per_gpu', 'infer_max_token_len_per_gpu',
        'infer_micro_batch_size_per_gpu', 'use_fused_kernels', 'use_remove_padding', 'seed', 'full_determinism',
        'wrap_policy', 'offload_policy', 'reshard_after_forward', 'fsdp_size', 'forward_prefetch', 'model_dtype',
        'use_orig_params', 'mixed_precision', 'ulysses_sequence_parallel_size', 'entropy_from_logits_with_chunking',
        'use_torch_compile', 'entropy_checkpointing',),
    "McoreEngineConfig": ('param_offload', 'optimizer_offload', 'grad_offload', 'forward_only', 'strategy', 'dtype',
        'use_dynamic_bsz', 'max_token_len_per_gpu', 'micro_batch_size_per_gpu', 'infer_max_token_len_per_gpu',
        'infer_micro_batch_size_per_gpu', 'use_fused_kernels', 'use_remove_padding', 'seed', 'full_determinism',
        'tensor_model_parallel_size', 'expert_model_parallel_size', 'expert_tensor_parallel_size',
        'pipeline_model_parallel_size', 'virtual_pipeline_model_parallel_size', 'context_parallel_size',
        'sequence_parallel', 'use_distributed_optimizer', 'use_dist_checkpointing', 'dist_checkpointing_path',
        'dist_checkpointing_prefix', 'override_ddp_config', 'override_transformer_config',
        'override_mcore_model_config', 'use_mbridge', 'vanilla_mbridge',),
    "TrainingWorkerConfig": ('model_type', 'model_config', 'engine_config', 'optimizer_config', 'checkpoint_config',
        'profiler_config',),
    "VeOmniEngineConfig": ('param_offload', 'optimizer_offload', 'grad_offload', 'forward_only', 'strategy', 'dtype',
        'use_dynamic_bsz', 'max_token_len_per_gpu', 'micro_batch_size_per_gpu', 'infer_max_token_len_per_gpu',
        'infer_micro_batch_size_per_gpu', 'use_fused_kernels', 'use_remove_padding', 'seed', 'full_determinism',
        'wrap_policy', 'offload_policy', 'reshard_after_forward', 'forward_prefetch', 'use_orig_params',
        'entropy_from_logits_with_chunking', 'use_torch_compile', 'entropy_checkpointing', 'data_parallel_size',
        'data_parallel_replicate_size', 'data_parallel_shard_size', 'tensor_parallel_size', 'expert_parallel_size',
        'pipeline_parallel_size', 'context_parallel_size', 'ulysses_parallel_size', 'data_parallel_mode',
        'mixed_precision', 'init_device', 'enable_full_shard', 'ckpt_manager', 'load_checkpoint_path',
        'enable_fsdp_offload', 'enable_reentrant', 'attn_implementation', 'moe_implementation',
        'force_use_huggingface', 'activation_gpu_limit', 'basic_modules',),
    "HFModelConfig": ('path', 'local_path', 'hf_config_path', 'local_hf_config_path', 'tokenizer_path',
        'local_tokenizer_path', 'load_tokenizer', 'hf_config', 'generation_config', 'tokenizer', 'processor',
        'use_shm', 'trust_remote_code', 'custom_chat_template', 'external_lib', 'override_config',
        'enable_gradient_checkpointing', 'enable_activation_offload', 'use_remove_padding', 'lora_rank',
        'lora_alpha', 'target_modules', 'exclude_modules', 'lora', 'lora_adapter_path', 'use_liger',
        'use_fused_kernels', 'fused_kernel_options', 'tiled_mlp', 'architectures',),
    "OptimizerConfig": ('lr', 'lr_warmup_steps_ratio', 'total_training_steps', 'weight_decay', 'lr_warmup_steps',
        'betas', 'clip_grad', 'grad_clip',),
    "FSDPOptimizerConfig": ('lr', 'lr_warmup_steps_ratio', 'total_training_steps', 'weight_decay', 'lr_warmup_steps',
        'betas', 'clip_grad', 'grad_clip', 'optimizer', 'optimizer_impl', 'min_lr_ratio', 'warmup_style',
        'lr_scheduler_type', 'num_cycles', 'override_optimizer_config',),
    "McoreOptimizerConfig": ('lr', 'lr_warmup_steps_ratio', 'total_training_steps', 'weight_decay', 'lr_warmup_steps',
        'betas', 'clip_grad', 'grad_clip', 'optimizer', 'lr_warmup_init', 'lr_decay_steps', 'lr_decay_style',
        'min_lr', 'weight_decay_incr_style', 'lr_wsd_decay_style', 'lr_wsd_decay_steps',
        'use_checkpoint_opt_param_scheduler', 'override_optimizer_config',),
    "VeOmniOptimizerConfig": ('lr', 'lr_warmup_steps_ratio', 'total_training_steps', 'weight_decay', 'lr_warmup_steps',
        'betas', 'clip_grad', 'grad_clip', 'optimizer', 'lr_min', 'lr_start', 'lr_decay_ratio', 'lr_scheduler_type',
        'override_optimizer_config',),
    "SandboxFusionConfig": ('url', 'max_concurrent', 'memory_limit_mb',),
    "RewardModelConfig": ('reward_manager', 'enable', 'enable_resource_pool', 'n_gpus_per_node', 'nnodes', 'rollout',
        'model', 'sandbox_fusion',),
    "SamplingConfig": ('temperature', 'top_k', 'top_p', 'do_sample', 'n',),
    "MultiTurnConfig": ('enable', 'max_assistant_turns', 'tool_config_path', 'max_user_turns', 'max_parallel_calls',
        'max_tool_response_length', 'tool_response_truncate_side', 'interaction_config_path',
        'use_inference_chat_template', 'tokenization_sanity_check_mode', 'format', 'num_repeat_rollouts',),
    "CustomAsyncServerConfig": ('path', 'name',),
    "AgentLoopConfig": ('num_workers', 'default_agent_loop', 'agent_loop_config_path', 'custom_async_server',
        'agent_loop_manager_class',),
    "TraceConfig": ('backend', 'token2text', 'max_samples_per_step_per_worker',),
    "ServerConfig": ('timeout', 'max_attempts', 'retry_delay', 'max_connections', 'max_start_wait_time',),
    "PrometheusConfig": ('enable', 'port', 'file', 'served_model_name',),
    "RolloutConfig": ('name', 'mode', 'temperature', 'top_k', 'top_p', 'do_sample', 'n', 'repetition_penalty',
        'over_sample_rate', 'prompt_length', 'response_length', 'dtype', 'gpu_memory_utilization', 'ignore_eos',
        'enforce_eager', 'cudagraph_capture_sizes', 'free_cache_engine', 'data_parallel_size',
        'expert_parallel_size', 'tensor_model_parallel_size', 'pipeline_model_parallel_size',
        'max_num_batched_tokens', 'logprobs_mode', 'val_kwargs', 'max_model_len', 'max_num_seqs',
        'log_prob_micro_batch_size', 'log_prob_micro_batch_size_per_gpu', 'log_prob_use_dynamic_bsz',
        'log_prob_max_token_len_per_gpu', 'disable_log_stats', 'multi_stage_wake_up', 'engine_kwargs',
        'calculate_log_probs', 'agent', 'trace', 'multi_turn', 'server', 'prometheus', 'custom',
        'update_weights_bucket_megabytes', 'skip_rollout', 'skip_dump_dir', 'profiler', 'enable_chunked_prefill',
        'enable_prefix_caching', 'load_format', 'layered_summon', 'layer_name_map', 'sglang_engine_mode',
        'limit_images', 'skip_tokenizer_init', 'quantization', 'quantization_config_file',
        'enable_rollout_routing_replay', 'enable_sleep_mode',),
}


def _compose(name, *overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=["actor_rollout_ref.rollout.name=hf", *overrides])


def test_every_public_name_of_verl_imports():
    from verl.workers import config

    missing = [n for n in VERL_ALL if not hasattr(config, n)]
    assert missing == []
    assert set(VERL_ALL) <= set(config.__all__)


@pytest.mark.parametrize("name", sorted(VERL_FIELDS))
def test_verl_fields_are_on_our_class(name):
    cls = getattr(wc, name)
    ours = {f.name for f in dataclasses.fields(cls)}
    missing = [f for f in VERL_FIELDS[name] if f not in ours and not hasattr(cls, f)]
    assert missing == []


def _assert_values_equal(obj, expected: dict, where: str):
    for k, v in expected.items():
        got = getattr(obj, k)
        if isinstance(v, dict) and dataclasses.is_dataclass(got):
            _assert_values_equal(got, v, f"{where}.{k}")
        elif isinstance(v, list):
            assert list(got) == v, f"{where}.{k}"
        else:
            assert got == v and type(got) is type(v) or (isinstance(v, (int, float)) and got == v), \
                f"{where}.{k}: {got!r} != yaml {v!r}"


SECTIONS = [
    ("ppo_trainer", "actor_rollout_ref.actor", "FSDPActorConfig"),
    ("ppo_trainer", "actor_rollout_ref.actor.optim", "FSDPOptimizerConfig"),
    ("ppo_trainer", "actor_rollout_ref.actor.fsdp_config", "FSDPEngineConfig"),
    ("ppo_trainer", "actor_rollout_ref.actor.policy_loss", "PolicyLossConfig"),
    ("ppo_trainer", "actor_rollout_ref.rollout", "RolloutConfig"),
    ("ppo_trainer", "actor_rollout_ref.rollout.val_kwargs", "SamplingConfig"),
    ("ppo_trainer", "actor_rollout_ref.rollout.multi_turn", "MultiTurnConfig"),
    ("ppo_trainer", "actor_rollout_ref.model", "HFModelConfig"),
    ("ppo_trainer", "critic", "FSDPCriticConfig"),
    ("ppo_trainer", "critic.model", "FSDPCriticModelCfg"),
    ("ppo_trainer", "reward_model", "RewardModelConfig"),
    ("ppo_megatron_trainer", "actor_rollout_ref.actor", "McoreActorConfig"),
    ("ppo_megatron_trainer", "actor_rollout_ref.actor.megatron", "McoreEngineConfig"),
    ("ppo_megatron_trainer", "actor_rollout_ref.actor.optim", "McoreOptimizerConfig"),
    ("ppo_megatron_trainer", "critic", "McoreCriticConfig"),
    ("ppo_megatron_trainer", "critic.megatron", "McoreEngineConfig"),
]


@pytest.fixture(scope="module")
def composed():
    return {name: _compose(name, "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.clip_ratio_high=0.28",
                           "actor_rollout_ref.actor.optim.lr=3e-6")
            for name in ("ppo_trainer", "ppo_megatron_trainer")}


@pytest.mark.parametrize("yaml_name, path, cls_name", SECTIONS, ids=lambda x: x if isinstance(x, str) else None)
def test_yaml_sections_become_the_classes_with_the_yamls_values(composed, yaml_name, path, cls_name):
    node = OmegaConf.select(composed[yaml_name], path)
    expected = OmegaConf.to_container(node, resolve=True)
    by_place = omega_conf_to_dataclass(node)  # no class: picked from the section's place (and strategy)
    assert type(by_place) is getattr(wc, cls_name)
    _assert_values_equal(by_place, expected, path)
    given = omega_conf_to_dataclass(node, getattr(wc, cls_name))
    assert given == by_place


def test_overrides_reach_the_objects(composed):
    actor = omega_conf_to_dataclass(composed["ppo_trainer"].actor_rollout_ref.actor)
    assert (actor.clip_ratio_high, actor.optim.lr, actor.rollout_n) == (0.28, 3e-6, 4)
    assert actor.engine is actor.fsdp_config
    megatron = omega_conf_to_dataclass(composed["ppo_megatron_trainer"].actor_rollout_ref.actor)
    assert megatron.strategy == "megatron" and megatron.engine is megatron.megatron


def test_target_key_names_the_class():
    node = OmegaConf.create({"_target_": "verl.workers.config.McoreOptimizerConfig", "lr": 2e-5})
    optim = omega_conf_to_dataclass(node)
    assert isinstance(optim, wc.McoreOptimizerConfig) and optim.lr == 2e-5
    assert omega_conf_to_dataclass({"_target_": "verl.workers.config.SamplingConfig", "n": 3}).n == 3
    with pytest.raises(ConfigError, match="cannot import"):
        omega_conf_to_dataclass({"_target_": "verl.workers.config.NoSuchConfig"})
    # a node with neither _target_ nor a known place stays a plain dict
    assert omega_conf_to_dataclass(OmegaConf.create({"a": 1})) == {"a": 1}
    assert isinstance(omega_conf_to_dataclass({}, wc.FSDPActorConfig), wc.FSDPActorConfig)


def test_defaults_are_the_schemas():
    """One set of defaults: the class's are the schema section's (no second copy)."""
    table = specs(schema_actor.ActorConfig)
    actor = wc.FSDPActorConfig()
    for path, spec in table.items():
        obj = actor
        for part in path.split("."):
            obj = getattr(obj, part)
        assert obj == spec.default or (isinstance(obj, list) and obj == list(spec.default)), path


@pytest.mark.parametrize("build, message", [
    (lambda: wc.FSDPActorConfig(use_prefix_grouper=True), "FSDPActorConfig.use_prefix_grouper=True is not supported"),
    (lambda: wc.FSDPActorConfig(calculate_sum_pi_squared=True),
     "FSDPActorConfig.calculate_sum_pi_squared=True is not supported"),
    (lambda: wc.FSDPActorConfig(router_replay={"mode": "R3"}), "FSDPActorConfig.router_replay.mode='R3' is not supported"),
    (lambda: wc.RolloutConfig(skip_rollout=True), "RolloutConfig.skip_rollout=True is not supported"),
    (lambda: wc.RolloutConfig(repetition_penalty=1.1), "RolloutConfig.repetition_penalty=1.1 is not supported"),
    (lambda: wc.McoreEngineConfig(use_dist_checkpointing=True),
     "McoreEngineConfig.use_dist_checkpointing=True is not supported"),
    (lambda: wc.McoreOptimizerConfig(lr_decay_style="cosine"), "McoreOptimizerConfig.lr_decay_style='cosine' is not"),
    (lambda: wc.FSDPEngineConfig(grad_offload=True), "FSDPEngineConfig.grad_offload=True is not supported"),
    (lambda: wc.HFModelConfig(lora={"rank": 8, "type": "dora"}), "HFModelConfig.lora.type='dora' is not supported"),
    (lambda: wc.ServerConfig(timeout=0), "ServerConfig.timeout=0 must be a number > 0"),  # any valid value: no effect
    (lambda: wc.VeOmniEngineConfig(), "VeOmni engine is not available"),
    # types and ranges are the schema's
    (lambda: wc.FSDPActorConfig(clip_ratio=-0.1), "FSDPActorConfig.clip_ratio=-0.1 must be a number >= 0"),
    (lambda: wc.RolloutConfig(top_p=1.5), "RolloutConfig.top_p=1.5 must be a number in (0, 1]"),
    (lambda: wc.FSDPCriticConfig(optim={"lr": -1}), "FSDPCriticConfig.optim.lr=-1 must be a number >= 0"),
    (lambda: wc.FSDPActorConfig(optim={"lrr": 1}), "unknown key 'FSDPActorConfig.optim.lrr' (did you mean"),
])
def test_unsupported_and_invalid_values_are_refused_by_name(build, message):
    with pytest.raises(ConfigError) as err:
        build()
    assert message in str(err.value)


def test_errors_name_the_yaml_key():
    cfg = _compose("ppo_trainer", "actor_rollout_ref.actor.use_prefix_grouper=true")
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.actor\.use_prefix_grouper=True is not supported"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    cfg = _compose("ppo_trainer", "critic.optim.weight_decay=-1")
    with pytest.raises(ConfigError, match=r"^critic\.optim\.weight_decay=-1 must be a number >= 0"):
        omega_conf_to_dataclass(cfg.critic)


def test_instances_are_frozen_and_dict_like():
    actor = wc.FSDPActorConfig(clip_ratio=0.3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        actor.clip_ratio = 0.1
    with pytest.raises(dataclasses.FrozenInstanceError):
        actor.optim.lr = 1.0
    assert actor["clip_ratio"] == 0.3 and actor.get("optim").lr == 1e-6 and actor.get("missing", 7) == 7
    with pytest.raises(ConfigError, match="use_prefix_grouper=True is not supported"):
        dataclasses.replace(actor, use_prefix_grouper=True)  # a changed copy is checked again
    assert pickle.loads(pickle.dumps(actor)) == actor


def test_verl_aliases_are_applied_once():
    optim = wc.FSDPOptimizerConfig(grad_clip=0.5, warmup_style="cosine")
    assert (optim.clip_grad, optim.lr_scheduler_type) == (0.5, "cosine")


def test_hf_model_config_loads_on_first_read_and_pickles_without_it(tmp_path):
    from verl.utils.embedded import make_model_dir

    path = make_model_dir(str(tmp_path / "model"), size="tiny", seed=0)
    model = omega_conf_to_dataclass(_compose("ppo_trainer", f"actor_rollout_ref.model.path={path}").actor_rollout_ref.model)
    assert "tokenizer" not in model.__dict__
    assert model.tokenizer.pad_token_id is not None
    assert model.hf_config.pad_token_id == model.tokenizer.pad_token_id
    assert model.local_path == path and model.architectures
    copy = pickle.loads(pickle.dumps(model))
    assert copy == model and "tokenizer" not in copy.__dict__
