"""The config schema: one source of truth for the yamls' keys and defaults, typed frozen configs, and errors that
name the key and the allowed range for every kind of bad value (before any worker starts)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from tests.trainer.validator_assets import write_validator_assets
from verl.trainer.config_schema import typed_ppo_config, validate_ppo_config
from verl.trainer.config_schema.catalog import SHIPPED
from verl.trainer.config_schema.ppo import IS_LEVELS, REWEIGHT_METHODS
from verl.trainer.config_schema.spec import _leaf_paths, _lookup, specs
from verl.trainer.ppo import pf_ppo, rollout_corr
from verl.trainer.sft.config import validate_sft_config
from verl.utils.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")


def _compose(name, overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=list(overrides))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    write_validator_assets(root)
    return root


def ppo(assets, *extra):
    return _compose("ppo_trainer", [
        f"data.train_files={assets / 'train.parquet'}", f"data.val_files={assets / 'train.parquet'}",
        f"actor_rollout_ref.model.path={assets / 'model'}", f"critic.model.path={assets / 'model'}",
        "actor_rollout_ref.rollout.name=hf", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=2", "trainer.logger=console", *extra])


# ------------------------------------------------------------------------------------- one source of truth

@pytest.mark.parametrize("shipped", SHIPPED, ids=lambda y: y.name)
def test_schema_and_yaml_have_the_same_keys_and_defaults(shipped):
    cfg = _compose(shipped.name)
    table = specs(shipped.schema)
    sections = {p.rsplit(".", i)[0] for p in table for i in range(1, p.count(".") + 1)}
    free = [p for p, s in table.items() if s.free_form]  # a free-form mapping's own keys are the user's
    leaves = [p for p in _leaf_paths(cfg) if p not in sections and not p.startswith("hydra")
              and not any(p.startswith(f + ".") for f in free)]
    assert sorted(set(leaves) - set(table)) == [], "keys in the yaml that the schema does not declare"
    missing = [p for p, s in table.items() if p not in leaves and not s.optional]
    assert missing == [], "keys the schema declares that the yaml lacks (mark them optional if that is intended)"
    problems, written = [], OmegaConf.to_container(cfg, resolve=False)
    for path in leaves:
        spec, raw = table[path], _lookup(written, path)
        if isinstance(raw, str) and raw.startswith("${"):
            source = spec.follows or ""
            if not source or source.lstrip(".") not in raw:
                problems.append(f"{path}: the yaml interpolates {raw}, the schema says follows={spec.follows!r}")
            continue
        if spec.follows:
            problems.append(f"{path}: the schema says it follows {spec.follows}, the yaml has {raw!r}")
        expected = shipped.defaults.get(path, spec.default)
        actual = raw
        if actual != expected or isinstance(actual, bool) != isinstance(expected, bool):
            problems.append(f"{path}: yaml {actual!r} != schema {expected!r}")
    assert problems == []


def _yaml_key_lines(text: str):
    """(dotted key, line) for every key line of a yaml file, from its indentation."""
    stack = []
    for line in text.splitlines():
        m = re.match(r"^(\s*)([A-Za-z_]\w*):", line)
        if not m:
            continue
        while stack and stack[-1][0] >= len(m.group(1)):
            stack.pop()
        stack.append((len(m.group(1)), m.group(2)))
        yield ".".join(k for _, k in stack), line


@pytest.mark.parametrize("name, file, prefix", [
    ("ppo_trainer", "ppo_trainer.yaml", ""), ("sft_trainer", "sft_trainer.yaml", ""),
    # sft_trainer_engine.yaml and the Hydra group files it composes (each under its package)
    ("sft_trainer_engine", "sft_trainer_engine.yaml", ""), ("sft_trainer_engine", "model/hf_model.yaml", "model."),
    ("sft_trainer_engine", "engine/fsdp.yaml", "engine."), ("sft_trainer_engine", "optim/fsdp.yaml", "optim."),
    ("sft_trainer_engine", "profiler/profiler.yaml", "profiler.")])
def test_yaml_marks_exactly_the_default_only_keys(name, file, prefix):
    schema = next(y.schema for y in SHIPPED if y.name == name)
    table = specs(schema)
    text = (Path(CONFIG_DIR) / file).read_text()
    lines = [(prefix + path, line) for path, line in _yaml_key_lines(text)]
    assert any(path in table for path, _ in lines)
    # a key that accepts more values than its default (an ``ok`` rule beside the refusal) is not "default only"
    wrong = [f"{path}: marked {'[default only]' in line}, schema unsupported={table[path].unsupported!r}"
             for path, line in lines
             if path in table and ("[default only]" in line)
             != (table[path].unsupported is not None and table[path].ok is None)]
    assert wrong == []


def test_choices_the_schema_copies_match_the_code():
    assert IS_LEVELS == rollout_corr.IS_LEVELS
    assert REWEIGHT_METHODS == pf_ppo.REWEIGHT_METHODS


def test_every_key_is_documented_and_classified():
    for shipped in SHIPPED:
        for path, spec in specs(shipped.schema).items():
            assert spec.doc.strip(), f"{path} has no description"
            assert spec.honoured == bool(spec.read_in) or not spec.honoured, path
            assert spec.honoured != (spec.unsupported is not None or spec.inert is not None), path
            assert spec.unsupported is None or spec.inert is None, path  # refused unless default, or no effect


# ------------------------------------------------------------------------------------- types and ranges

@pytest.mark.parametrize("override, message", [
    # probabilities outside [0, 1]
    ("actor_rollout_ref.rollout.top_p=1.5", "actor_rollout_ref.rollout.top_p=1.5 must be a number in (0, 1]"),
    ("actor_rollout_ref.rollout.val_kwargs.top_p=-0.1", "val_kwargs.top_p=-0.1 must be a number in (0, 1]"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=1.2", "gpu_memory_utilization=1.2 must be a number in (0, 1]"),
    ("algorithm.gamma=1.01", "algorithm.gamma=1.01 must be a number in [0, 1]"),
    ("algorithm.lam=-0.5", "algorithm.lam=-0.5 must be a number in [0, 1]"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=2", "lr_warmup_steps_ratio=2 must be a number in [0, 1]"),
    # negative clip ratios
    ("actor_rollout_ref.actor.clip_ratio=-0.2", "actor_rollout_ref.actor.clip_ratio=-0.2 must be a number >= 0"),
    ("actor_rollout_ref.actor.clip_ratio_high=-0.1", "clip_ratio_high=-0.1 must be a number >= 0"),
    ("critic.cliprange_value=-1", "critic.cliprange_value=-1 must be a number >= 0"),
    ("actor_rollout_ref.actor.clip_ratio_c=0.5", "clip_ratio_c=0.5 must be a number > 1"),
    # temperatures, ranks, coefficients, learning rates
    ("actor_rollout_ref.rollout.temperature=-1", "actor_rollout_ref.rollout.temperature=-1 must be a number >= 0"),
    ("actor_rollout_ref.model.lora_rank=-8", "actor_rollout_ref.model.lora_rank=-8 must be an integer >= 0"),
    ("actor_rollout_ref.actor.kl_loss_coef=-0.1", "kl_loss_coef=-0.1 must be a number >= 0"),
    ("actor_rollout_ref.actor.optim.lr=-1e-6", "actor_rollout_ref.actor.optim.lr=-1e-06 must be a number >= 0"),
    ("critic.optim.lr=-0.5", "critic.optim.lr=-0.5 must be a number >= 0"),
    # lengths and counts <= 0
    ("data.max_prompt_length=0", "data.max_prompt_length=0 must be an integer >= 1"),
    ("data.max_response_length=-4", "data.max_response_length=-4 must be an integer >= 1"),
    ("actor_rollout_ref.rollout.response_length=0", "rollout.response_length=0 must be an integer >= 1"),
    ("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n=0 must be an integer >= 1"),
    ("actor_rollout_ref.actor.ppo_epochs=0", "actor_rollout_ref.actor.ppo_epochs=0 must be an integer >= 1"),
    ("data.train_batch_size=0", "data.train_batch_size=0 must be an integer >= 1"),
    ("trainer.total_epochs=0", "trainer.total_epochs=0 must be an integer >= 1"),
    # frequencies that are not integers, and wrong types
    ("trainer.save_freq=1.5", "trainer.save_freq=1.5 must be an integer >= 1, or -1 or 0 (never)"),
    ("trainer.test_freq=often", "trainer.test_freq='often' must be an integer >= 1, or -1 or 0 (never)"),
    ("trainer.save_freq=-3", "trainer.save_freq=-3 must be an integer >= 1, or -1 or 0 (never)"),
    ("actor_rollout_ref.actor.use_kl_loss=yes", "actor_rollout_ref.actor.use_kl_loss='yes' must be true or false"),
    ("actor_rollout_ref.rollout.top_k=0.5", "actor_rollout_ref.rollout.top_k=0.5 must be an integer >= 1, or -1 or 0"),
    # choices, with a hint for a near miss
    ("algorithm.adv_estimator=grpoo", "algorithm.adv_estimator='grpoo' is not one of: .* \\(did you mean 'grpo'\\?\\)"),
    ("actor_rollout_ref.actor.loss_agg_mode=token_mean", "loss_agg_mode='token_mean' is not one of: .*did you mean"),
])
def test_out_of_range_values_name_the_key_and_the_range(assets, override, message):
    with pytest.raises(ConfigError, match=message if ".*" in message else re.escape(message)):
        validate_ppo_config(ppo(assets, override))


@pytest.mark.parametrize("override, message", [
    ("optim.lr=-1", "optim.lr=-1 must be a number >= 0"),
    ("data.max_length=0", "data.max_length=0 must be an integer >= 1"),
    ("model.lora_rank=-1", "model.lora_rank=-1 must be an integer >= 0"),
    ("trainer.save_freq=2.5", "trainer.save_freq=2.5 must be an integer >= 1"),
    ("optim.lr_warmup_steps_ratio=1.5", "optim.lr_warmup_steps_ratio=1.5 must be a number in \\[0, 1\\]"),
    ("ulysses_sequence_parallel_size=2", "ulysses_sequence_parallel_size=2 must divide the number of processes"),
    ("data.balance_dp_token=true", "data.balance_dp_token=True is not supported"),
    ("trainer.n_gpus_per_node=3", "trainer.n_gpus_per_node=3 disagrees with the launcher"),
])
def test_sft_values_name_the_key(assets, override, message):
    base = [f"data.train_files={assets / 'train.parquet'}", f"data.val_files={assets / 'train.parquet'}"]
    with pytest.raises(ConfigError, match=message):
        validate_sft_config(_compose("sft_trainer", base + [override]), 1, "cpu")
    # the launcher keys agree with the world size: accepted
    validate_sft_config(_compose("sft_trainer", base + ["trainer.n_gpus_per_node=2", "data.train_batch_size=8"]), 2,
                        "cpu")


# ------------------------------------------------------------------------------------- default-only keys

@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2", "num_repeat_rollouts=2 is not supported"),
    ("actor_rollout_ref.model.enable_activation_offload=true", "enable_activation_offload=True is not supported"),
    ("actor_rollout_ref.actor.optim.total_training_steps=100", "set trainer.total_training_steps instead"),
    ("actor_rollout_ref.actor.rollout_n=4", "actor.rollout_n=4 is not supported: .*actor_rollout_ref.rollout.n"),
    ("critic.model.lora_rank=8", "critic.model.lora_rank=8 is not supported"),
    ("actor_rollout_ref.hybrid_engine=false", "hybrid_engine=False is not supported"),
])
def test_keys_without_an_implementation_are_refused_unless_default(assets, override, message):
    with pytest.raises(ConfigError, match=message):
        validate_ppo_config(ppo(assets, override))


def test_offload_and_equivalent_values_are_accepted(assets):
    plan = validate_ppo_config(ppo(assets, "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                                   "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                                   "critic.model.fsdp_config.param_offload=true", "actor_rollout_ref.actor.strategy=fsdp2",
                                   "actor_rollout_ref.rollout.n=2", "algorithm.adv_estimator=grpo"))
    assert plan.config.actor_rollout_ref.actor.fsdp_config.param_offload is True
    # the actor's rollout_n follows rollout.n through the yaml's interpolation: not a user setting, accepted
    assert plan.config.actor_rollout_ref.actor.rollout_n == 2


def test_a_config_resolved_before_validation_passes_the_same_way(assets):
    """main_ppo resolves the config (paths made absolute) and the TaskRunner validates it again: keys that
    followed their source now hold its value literally and must still be accepted; a different value is not."""
    cfg = ppo(assets, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
              "actor_rollout_ref.actor.use_kl_loss=true")
    OmegaConf.resolve(cfg)
    assert cfg.actor_rollout_ref.actor.rollout_n == 4 and cfg.actor_rollout_ref.ref.rollout_n == 4
    assert validate_ppo_config(cfg).batch_sizes["actor"].ppo_mini_batch_size == 8
    cfg.actor_rollout_ref.ref.rollout_n = 2
    with pytest.raises(ConfigError, match="actor_rollout_ref.ref.rollout_n=2 is not supported"):
        validate_ppo_config(cfg)


# ------------------------------------------------------------------------------------- unknown keys

def test_unknown_keys_get_a_did_you_mean_and_others_a_warning(assets, capsys):
    cfg = ppo(assets)
    with open_dict(cfg):
        cfg.trainer.totl_epochs = 3
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.totl_epochs' \(did you mean 'trainer.total_epochs'"):
        validate_ppo_config(cfg)
    cfg = ppo(assets, "+trainer.my_recipe_flag=1", "+actor_rollout_ref.model.override_config.attn_implementation=eager")
    validate_ppo_config(cfg)
    out = capsys.readouterr().out
    assert "'trainer.my_recipe_flag' is not a known config key" in out and "override_config" not in out


def test_keys_verl_examples_carry_but_verl_never_reads_are_ignored_with_a_warning(assets, capsys):
    # close to known keys (rollout.mode), so any other such key is refused as a typo; verl's own example config
    # (gsm8k_multiturn_grpo_server.yaml) sets this one and verl reads nothing under that name
    cfg = ppo(assets, "+actor_rollout_ref.rollout.sglang_rollout_mode=server")
    validate_ppo_config(cfg)
    assert "'actor_rollout_ref.rollout.sglang_rollout_mode' is ignored" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="unknown config key 'actor_rollout_ref.rollout.sglang_rolout_mode'"):
        validate_ppo_config(ppo(assets, "+actor_rollout_ref.rollout.sglang_rolout_mode=server"))


# ------------------------------------------------------------------------------------- typed, frozen

def test_typed_config_is_frozen_and_carries_the_values(assets):
    plan = validate_ppo_config(ppo(assets, "actor_rollout_ref.actor.optim.lr=3e-6", "critic.optim.lr=2e-5"))
    typed = plan.config
    assert typed.actor_rollout_ref.actor.optim.lr == 3e-6 and typed.critic.optim.lr == 2e-5
    assert typed.actor_rollout_ref.rollout.name == "hf" and typed.trainer.n_gpus_per_node == 2
    assert typed.critic.ppo_micro_batch_size_per_gpu == 2 and typed.critic.rollout_n == 1
    assert typed.actor_rollout_ref.actor["clip_ratio"] == 0.2  # mapping-style access, as on a DictConfig
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.actor_rollout_ref.actor.optim.lr = 1.0
    cfg = ppo(assets)
    assert typed_ppo_config(cfg) != validate_ppo_config(cfg).config  # validation normalises trainer.logger=console
    assert typed_ppo_config(cfg) == validate_ppo_config(cfg).config and typed_ppo_config(cfg).trainer.logger == ["console"]


def test_a_lora_adapter_path_sets_the_lora_keys_and_is_checked_before_workers_start(assets, tmp_path):
    """verl's run_qwen2_5-3b_gsm8k_grpo_lora_from_adapter.sh passes model.lora_adapter_path alone: the adapter's
    rank, alpha and target modules become the run's LoRA keys (driver, printed); a directory without an adapter
    or a lora_rank that disagrees with it is refused by name."""
    import json

    from verl.trainer.host_defaults import resolve_lora_adapter

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 8, "lora_alpha": 32, "target_modules": ["v_proj", "q_proj"]}))
    key = "actor_rollout_ref.model.lora_adapter_path"
    cfg = ppo(assets, f"{key}={adapter}")
    changes = resolve_lora_adapter(cfg)
    model = cfg.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, list(model.target_modules)) == (8, 32, ["q_proj", "v_proj"])
    assert [c[0].rsplit(".", 1)[-1] for c in changes] == ["lora_rank", "lora_alpha", "target_modules"]
    plan = validate_ppo_config(cfg)
    assert plan.ref_in_actor  # LoRA: the reference is the adapter-free base inside the actor
    with pytest.raises(ConfigError, match=f"{key}=.*no adapter_config.json there"):
        validate_ppo_config(ppo(assets, f"{key}={tmp_path}", "actor_rollout_ref.model.lora_rank=8"))
    wrong = ppo(assets, f"{key}={adapter}", "actor_rollout_ref.model.lora_rank=4")
    assert resolve_lora_adapter(wrong) == []  # set by the user: left for validation to name
    with pytest.raises(ConfigError, match="lora_rank=4 but the adapter at .* has rank 8"):
        validate_ppo_config(wrong)
