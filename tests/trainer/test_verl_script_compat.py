"""Keys that verl's own example scripts set: each is accepted (and does what verl's does) or refused before Ray
starts with a message that names it and says why. Found by validating verl's example scripts against the driver.

Runs the driver's pre-Ray path in this process: the command-line check, Hydra composition, the dynamic-sampling
check of main_ppo and the config validator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.trainer.validator_assets import add_tokenizer_file, write_rl_parquet
from verl.trainer import main_ppo
from verl.trainer.config_schema import validate_ppo_config
from verl.utils.config import ConfigError
from verl.utils.device import get_device_name

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat")
    write_rl_parquet(root / "train.parquet")
    model = root / "model"
    model.mkdir()
    # a Qwen2 config with head and layer counts that tensor / pipeline size 2 divide (no weights are read)
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 128,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "tie_word_embeddings": True}))
    add_tokenizer_file(root / "model")
    return root


def _base(assets) -> list[str]:
    return [f"data.train_files={assets / 'train.parquet'}", f"data.val_files={assets / 'train.parquet'}",
            f"actor_rollout_ref.model.path={assets / 'model'}", f"critic.model.path={assets / 'model'}",
            "actor_rollout_ref.rollout.name=hf", "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
            "trainer.n_gpus_per_node=2", "trainer.logger=console"]


def driver_check(assets, *overrides, config_name="ppo_trainer"):
    """What ``python -m verl.trainer.main_ppo [--config-name X] overrides...`` does before Ray; returns the
    config. A refusal raises SystemExit (the command line, exit 2) or ConfigError (the validator)."""
    args = _base(assets) + list(overrides)
    argv = args if config_name == "ppo_trainer" else ["--config-name", config_name, *args]
    main_ppo.precheck_cli(argv)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name=config_name, overrides=args)
    main_ppo.refuse_dynamic_sampling(cfg)
    validate_ppo_config(cfg)
    return cfg


def refused(assets, capsys, *overrides, config_name="ppo_trainer") -> str:
    try:
        driver_check(assets, *overrides, config_name=config_name)
    except SystemExit as e:
        assert e.code == 2
        return capsys.readouterr().err
    except ConfigError as e:
        return str(e)
    raise AssertionError(f"{overrides} were accepted")


MEGATRON = ("actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron")


def test_accepted_as_verl_accepts_them(assets):
    cfg = driver_check(assets, "actor_rollout_ref.rollout.layered_summon=True")
    assert cfg.actor_rollout_ref.rollout.layered_summon is True
    # keys that change nothing here (marked "no effect"): the torch head runs for either backend, the engine's
    # log-probs are always returned
    cfg = driver_check(assets, "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
                       "actor_rollout_ref.rollout.calculate_log_probs=True")
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    # DAPO's keys at values that leave dynamic sampling off: the run is the plain one, the keys are dropped
    cfg = driver_check(assets, "+data.gen_batch_size=8", "+algorithm.filter_groups.enable=False",
                       "+algorithm.filter_groups.metric=acc")
    assert "gen_batch_size" not in cfg.data and "filter_groups" not in cfg.algorithm
    # the reward model runs in the sharded FSDP2 engine: its fsdp_config keys reach it
    cfg = driver_check(assets, "reward_model.enable=True", f"reward_model.model.path={assets / 'model'}",
                       "reward_model.micro_batch_size_per_gpu=2", "reward_model.model.fsdp_config.param_offload=True",
                       "reward_model.model.fsdp_config.fsdp_size=2",
                       "reward_model.model.fsdp_config.reshard_after_forward=False")
    from verl.workers.engine.config import reward_engine_config

    engine = reward_engine_config(cfg.reward_model)
    assert engine.param_offload is True and engine.fsdp["fsdp_size"] == 2
    assert engine.fsdp["reshard_after_forward"] is False
    # a train batch that is not a multiple of the mini-batch (verl's scripts: 1024 prompts, mini-batches of 80)
    cfg = driver_check(assets, "data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    assert cfg.data.train_batch_size == 12
    for value in ("enable", "disable"):
        assert driver_check(assets, f"trainer.use_legacy_worker_impl={value}").trainer.use_legacy_worker_impl == value
    cfg = driver_check(assets, "data.filter_overlong_prompts=True", "data.filter_overlong_prompts_workers=8")
    assert cfg.data.filter_overlong_prompts_workers == 8
    assert cfg.data.tool_config_path is None  # follows the multi-turn tool config (unset here)
    # verl's code-reward server settings (docs/custom_reward.md)
    cfg = driver_check(assets, "reward_model.sandbox_fusion.url=http://localhost:8080/run_code",
                       "reward_model.sandbox_fusion.max_concurrent=8")
    assert cfg.reward_model.sandbox_fusion.max_concurrent == 8


def test_data_tool_config_path_follows_multi_turn_and_a_bad_file_is_named(assets, capsys):
    tools = assets / "tools.yaml"
    tools.write_text("tools:\n  - class_name: verl.tools.calculator_tool.CalculatorTool\n    config: {}\n")
    cfg = driver_check(assets, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}")
    assert cfg.data.tool_config_path == str(tools)
    assert driver_check(assets, f"data.tool_config_path={tools}").data.tool_config_path == str(tools)
    message = refused(assets, capsys, f"data.tool_config_path={assets / 'missing.yaml'}")
    assert "data.tool_config_path=" in message and "no such file" in message, message


@pytest.mark.parametrize("override, words", [
    ("actor_rollout_ref.rollout.quantization=fp8", "quantized rollout is not available"),
    ("actor_rollout_ref.rollout.trace.backend=weave", "W&B Weave service"),  # mlflow: tests/utils/test_rollout_trace.py
    ("+data.gen_batch_size=16", "differs from data.train_batch_size=8"),
    ("+algorithm.filter_groups.enable=True", "runs in the DAPO recipe"),
])
def test_refused_by_name_with_the_reason(assets, capsys, override, words):
    message = refused(assets, capsys, override)
    assert override.lstrip("+").split("=")[0] in message and words in message, message


def test_megatron_reference_and_critic_keys_follow_the_actor_and_can_be_set(assets):
    cfg = driver_check(assets, *MEGATRON, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                       "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
                       "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1",
                       "critic.megatron.tensor_model_parallel_size=2",
                       "actor_rollout_ref.actor.megatron.use_mbridge=True",
                       "actor_rollout_ref.actor.megatron.vanilla_mbridge=False",
                       "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
                       "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32",
                       config_name="ppo_megatron_trainer")
    ref, actor = cfg.actor_rollout_ref.ref.megatron, cfg.actor_rollout_ref.actor.megatron
    assert ref.tensor_model_parallel_size == 2 and ref.use_mbridge is True and ref.seed == actor.seed
    from verl.trainer.config_schema.engine import TRANSFORMER_OVERRIDE_DEFAULTS

    # verl's default entries (set without '+' by its scripts) plus the added one, followed by the reference
    assert dict(ref.override_transformer_config) == {**TRANSFORMER_OVERRIDE_DEFAULTS, "moe_router_dtype": "fp32"}
    assert cfg.critic.megatron.tensor_model_parallel_size == 2
    # left unset, the reference follows the actor
    cfg = driver_check(assets, *MEGATRON, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                       config_name="ppo_megatron_trainer")
    assert cfg.actor_rollout_ref.ref.megatron.pipeline_model_parallel_size == 2


def test_megatron_offload_switches_are_accepted_on_cpu_and_refused_on_an_accelerator(assets):
    offload = ("actor_rollout_ref.actor.megatron.param_offload=True", "actor_rollout_ref.actor.megatron.grad_offload=True",
               "actor_rollout_ref.actor.megatron.optimizer_offload=True")
    if get_device_name() == "cpu":  # everything already lives in host memory: true changes nothing
        cfg = driver_check(assets, *MEGATRON, *offload, config_name="ppo_megatron_trainer")
        assert cfg.actor_rollout_ref.ref.megatron.param_offload is True  # the reference follows the actor
    from transformers import AutoConfig

    from verl.models.mcore.settings import check_megatron_settings

    hf = AutoConfig.from_pretrained(str(assets / "model"))
    check_megatron_settings({"param_offload": True}, hf, "actor.megatron", on_cpu=True)
    for k in ("param_offload", "grad_offload", "optimizer_offload"):
        with pytest.raises(ValueError, match=f"actor.megatron.{k}=True: the Megatron engine does not offload"):
            check_megatron_settings({k: True}, hf, "actor.megatron", on_cpu=False)


def test_megatron_optimizer_fields_and_scheduler_keys_of_verl_scripts(assets):
    """verl's Megatron scripts pass megatron-core OptimizerConfig fields through override_optimizer_config (null in
    the yaml, added with '+') and set the scheduler / dist-checkpointing keys at their defaults without '+'."""
    from verl.models.mcore.settings import optimizer_overrides

    mcore = {"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0, "overlap_cpu_optimizer_d2h_h2d": True,
             "use_precision_aware_optimizer": True}
    args = [f"+actor_rollout_ref.actor.optim.override_optimizer_config.{k}={v}" for k, v in mcore.items()]
    args += ["actor_rollout_ref.actor.optim.lr_decay_style=constant", "actor_rollout_ref.actor.optim.min_lr=0.0",
             "actor_rollout_ref.actor.megatron.use_dist_checkpointing=False",
             "actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=fused"]
    if get_device_name() == "cpu":  # the optimizer state already lives in host memory
        cfg = driver_check(assets, *MEGATRON, *args, config_name="ppo_megatron_trainer")
        assert dict(cfg.actor_rollout_ref.actor.optim.override_optimizer_config) == mcore
    # the torch optimizer gets only its own keyword arguments; megatron-core's fields are checked and taken out
    assert optimizer_overrides({**mcore, "amsgrad": True}, "actor.optim.override_optimizer_config", True) == \
        {"amsgrad": True}
    with pytest.raises(ValueError, match="optimizer_cpu_offload=True: the Megatron engine keeps the optimizer"):
        optimizer_overrides(mcore, "actor.optim.override_optimizer_config", on_cpu=False)
    with pytest.raises(ValueError, match="main_params_dtype='bf16' is not supported"):
        optimizer_overrides({"main_params_dtype": "bf16"}, "p", on_cpu=True)
    with pytest.raises(ValueError, match="optimizer_offload_fraction=1.5 must be a number in"):
        optimizer_overrides({"optimizer_offload_fraction": 1.5}, "p", on_cpu=True)


@pytest.mark.parametrize("overrides, words", [
    (("actor_rollout_ref.actor.megatron.use_dist_checkpointing=True",),
     "use_dist_checkpointing=True needs actor_rollout_ref.actor.megatron.dist_checkpointing_path"),
    (("actor_rollout_ref.actor.optim.lr_decay_style=cosine",), "lr_decay_style='cosine' is not supported"),
    (("actor_rollout_ref.actor.megatron.override_transformer_config.attention_backend=flashy",),
     "attention_backend='flashy' is not one of flash, fused, unfused, local, auto"),
    (("actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2"),
     "differs from actor_rollout_ref.actor.megatron"),
    (("algorithm.adv_estimator=gae", "critic.megatron.tensor_model_parallel_size=2"),
     "critic.megatron (tp, pp, ep, etp) = (2, 1, 1, 2) differs from actor_rollout_ref.actor.megatron (1, 1, 1, 1): "
     "the critic is built in the actor's processes"),
    (("reward_model.enable=True", "reward_model.strategy=megatron", "reward_model.model.path=${actor_rollout_ref.model.path}",
      "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"),
     "use the same sizes (reward_model.megatron.tensor_model_parallel_size=2 "
     "reward_model.megatron.expert_tensor_parallel_size=2), or give it processes of its own with "
     "reward_model.enable_resource_pool=True"),
    (("actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",),
     "has no experts; expert parallelism needs a mixture-of-experts model"),
    (("+actor_rollout_ref.actor.megatron.override_transformer_config.gradient_accumulation_fusion=True",),
     "override_transformer_config.gradient_accumulation_fusion=True needs CUDA kernels"),
    (("+actor_rollout_ref.actor.megatron.override_transformer_config.moe_token_dispatcher_type=flex",),
     "the flex token dispatcher (DeepEP) needs CUDA kernels"),
    (("+actor_rollout_ref.actor.megatron.override_transformer_config.num_layers=3",),
     "override_transformer_config.num_layers is set by the engine"),
])
def test_megatron_values_this_engine_cannot_run_are_refused_by_name(assets, capsys, overrides, words):
    if "CUDA" in words and get_device_name() != "cpu":
        pytest.skip("refused on CPU only; this host has an accelerator")
    message = refused(assets, capsys, *MEGATRON, *overrides, config_name="ppo_megatron_trainer")
    assert words in message, message
