"""Host-aware defaults: keys the user did not set resolve to what is fast on the machine the run is on.

verl's defaults are made for GPUs with scarce memory: bf16 compute and gradient checkpointing. On a CPU
without native bf16 (AVX2-only hosts) torch emulates bf16 10-20x slower than fp32, and on a CPU host the
model's training state usually fits in RAM many times over, so recomputing activations only costs time.

``resolve_host_defaults(config, explicit)`` changes, in place and only when the run is on CPU:

- compute dtypes (``actor/ref/critic fsdp_config.dtype``, ``rollout.dtype``) from bf16/fp16 to fp32 when the
  CPU has no native bf16 (no AVX-512 BF16, no AMX);
- ``enable_gradient_checkpointing`` (policy and critic) to False when 8x the model's weights (weights, gradients,
  two Adam moments, and as much again for activations) fit in half of the machine's memory;
- ``actor.old_log_prob_source`` from ``trainer`` (a separate log-prob pass over the batch) to ``update`` (the
  update's own forward, detached) when that is exact: one epoch, one mini-batch, nothing that needs the old
  log-probs before the update (KL in the reward, rollout importance sampling), FSDP actor;
- ``fsdp_config.reshard_after_forward`` (actor, reference, critic) to False when the run has one process (one
  rank's shard is the whole model; resharding after forward only repeats the gather in backward);
- ``model.share_prompt_prefix`` to True when ``rollout.n > 1`` with the FSDP actor: the n samples of a prompt
  run the prompt once in the actor and reference forwards (one packed row per prompt, same log-probs; the
  engine still computes plain rows where packing would not save compute, or the model cannot take the mask);
  ``critic.model.share_prompt_prefix`` the same for the FSDP critic's values when the run has a critic;
- ``rollout.tensor_model_parallel_size`` (verl's default 2) to 1 with ``rollout.name=hf`` on every device (HF
  generate has no tensor parallelism) and with vLLM on CPU, where the cores are shared by all engines anyway
  (2 cores: TP=2 generates at 0.98x the tokens/s of TP=1, within the run-to-run spread): one independent engine
  per worker process. A value you set is used as set (and checked);
- ``use_torch_compile`` (actor, reference, critic; verl's default True) to False on CPU: compiling the decoder
  layers costs 10-45 s per worker process before the first step. On GPUs and NPUs the default compiles them;
- ``model.lora_rank`` / ``lora_alpha`` / ``target_modules`` (on every device) from ``adapter_config.json`` when
  ``model.lora_adapter_path`` names a PEFT adapter and ``lora_rank`` is unset;
- ``reward_model.micro_batch_size_per_gpu`` (on every device), when the reward model is enabled and no micro batch
  of it is set (verl's reward-loop scripts set none): the rollout's ``log_prob_micro_batch_size_per_gpu``, a
  forward over the same sequences;
- the environment variables ``RAY_worker_niceness`` to 0 and ``RAY_max_direct_call_object_size`` to 1 MiB when
  this run starts its own Ray: Ray runs workers at nice 15, which on CPU (where the workers do the compute) lets
  any other busy process preempt them, and sends call arguments over 100 KiB through its object store, which
  costs a few ms per call for a small model's batches.

A key the user set stays as set: ``explicit`` holds the keys given on the command line (Hydra overrides); keys
whose value differs from the shipped yaml's default also count as set. On GPU and NPU only the HF rollout's
tensor-parallel size and the reward model's unset micro batch change (and nothing else). The
returned :class:`HostChoices` prints as one block that says what was chosen and why.

The decisions read one typed view of the config (the schema's frozen classes, built from it once, so a key the
yaml leaves out has the schema's default); the changes are written to the Hydra config itself, from which the
run's typed config is built afterwards. Whether a key was set by the user, or follows another key, is read from
the config as written (:func:`_as_written`): the typed view no longer shows it.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import platform
from dataclasses import dataclass, field
from operator import attrgetter

import psutil
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.trainer.config_schema.ppo import PPOTrainerConfig, as_ppo_config, need_critic
from verl.trainer.config_schema.rollout import RolloutConfig
from verl.trainer.config_schema.spec import build
from verl.utils.device import cpu_has_native_bf16, onednn_isa_cap, resolve_device

__all__ = ["HostChoices", "resolve_host_defaults", "resolve_rollout_tp", "resolve_torch_compile", "explicit_override_keys",
           "old_log_prob_update_blocker",
           "COMPUTE_DTYPE_KEYS", "CHECKPOINTING_KEYS", "OLD_LOG_PROB_KEY", "SHARE_PREFIX_KEY",
           "CRITIC_SHARE_PREFIX_KEY"]

AR = "actor_rollout_ref"
COMPUTE_DTYPE_KEYS = (f"{AR}.actor.fsdp_config.dtype", f"{AR}.ref.fsdp_config.dtype", "critic.model.fsdp_config.dtype",
                      f"{AR}.rollout.dtype")
CHECKPOINTING_KEYS = {f"{AR}.model.enable_gradient_checkpointing": f"{AR}.model.path",
                      "critic.model.enable_gradient_checkpointing": "critic.model.path"}
OLD_LOG_PROB_KEY = f"{AR}.actor.old_log_prob_source"
RESHARD_KEYS = (f"{AR}.actor.fsdp_config.reshard_after_forward", f"{AR}.ref.fsdp_config.reshard_after_forward",
                "critic.model.fsdp_config.reshard_after_forward")
SHARE_PREFIX_KEY = f"{AR}.model.share_prompt_prefix"
CRITIC_SHARE_PREFIX_KEY = "critic.model.share_prompt_prefix"
ROLLOUT_TP_KEY = f"{AR}.rollout.tensor_model_parallel_size"
NICENESS_ENV = "RAY_worker_niceness"
INLINE_ARGS_ENV = "RAY_max_direct_call_object_size"  # call arguments up to this size go inline, not via plasma
_HALF = {"bf16", "bfloat16", "fp16", "float16", "half"}


def _count(value) -> int:
    """An integer setting as a count; anything else (validation names it) counts as 0, which changes nothing."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def old_log_prob_update_blocker(config: DictConfig, typed: PPOTrainerConfig | None = None) -> str | None:
    """Why the update's own forward cannot stand in for the trainer's old-log-prob pass (None: it is exact).

    It is exact when the weights that would score the batch are the ones the update starts from and nothing
    reads the old log-probs before the update: one epoch, one mini-batch (every later mini-batch would see
    updated weights), no KL penalty in the reward, no rollout importance sampling or bypass mode. ``typed``: the
    config's typed view, when the caller has built it."""
    typed = as_ppo_config(config, typed)
    actor, algorithm = typed.actor_rollout_ref.actor, typed.algorithm
    if actor.strategy not in ("fsdp", "fsdp2"):
        return f"{AR}.actor.strategy={actor.strategy} scores old log-probs in its own pass"
    if actor.ppo_epochs != 1:
        return f"{AR}.actor.ppo_epochs={actor.ppo_epochs}: later epochs need the pre-update log-probs"
    mini, batch = actor.ppo_mini_batch_size, typed.data.train_batch_size
    if not isinstance(mini, int) or not isinstance(batch, int) or mini < batch:
        return (f"{AR}.actor.ppo_mini_batch_size={mini} < data.train_batch_size={batch}: later mini-batches need "
                "the pre-update log-probs")
    if algorithm.use_kl_in_reward:
        return "algorithm.use_kl_in_reward=True needs the old log-probs before the update"
    correction = algorithm.rollout_correction
    if correction is None:  # the section written as null: no correction
        return None
    if correction.bypass_mode:
        return "algorithm.rollout_correction.bypass_mode=True takes the old log-probs from the rollout"
    for name in ("rollout_is", "rollout_rs"):
        if getattr(correction, name):
            return f"algorithm.rollout_correction.{name} needs the old log-probs before the update"
    return None


@dataclass
class HostChoices:
    """What ``resolve_host_defaults`` decided, for the log."""

    device: str
    isa: str = ""
    native_bf16: bool = False
    memory_gib: float = 0.0
    changed: list = field(default_factory=list)  # (key, old, new, why)
    kept: list = field(default_factory=list)  # (key, value, why)

    def __str__(self) -> str:
        head = (f"Host-aware defaults: device={self.device}, cpu={self.isa or 'unknown'}, "
                f"native bf16={'yes' if self.native_bf16 else 'no'}, memory={self.memory_gib:.1f} GiB, "
                f"torch threads={torch.get_num_threads()}")
        lines = [head]
        lines += [f"  {key}: {old} -> {new}  ({why})" for key, old, new, why in self.changed]
        lines += [f"  {key}={value} kept ({why})" for key, value, why in self.kept]
        if len(lines) == 1:
            lines.append("  nothing changed (verl's defaults apply)")
        return "\n".join(lines)


def explicit_override_keys() -> set[str]:
    """Keys given on this process's Hydra command line (empty outside a Hydra app)."""
    if not HydraConfig.initialized():
        return set()
    keys = set()
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        if not key.startswith("hydra"):
            keys.add(key)
    return keys


def _cpu_isa() -> str:
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return platform.machine()
    isa = next((name for name in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if name in flags), platform.machine())
    cap = onednn_isa_cap()
    return f"{isa} (oneDNN capped at {cap})" if cap else isa


def _weights_bytes(model_path) -> int:
    if not model_path or not os.path.isdir(str(model_path)):
        return 0
    files = glob.glob(os.path.join(str(model_path), "*.safetensors")) + glob.glob(os.path.join(str(model_path), "*.bin"))
    return sum(os.path.getsize(f) for f in files)


@functools.lru_cache(maxsize=1)
def _shipped_defaults() -> DictConfig:
    """The shipped ppo_trainer.yaml as written (it has no defaults list to compose; works inside a Hydra app).
    Read once per process, read-only: every decision compares against the same file."""
    defaults = OmegaConf.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "config", "ppo_trainer.yaml"))
    OmegaConf.set_readonly(defaults, True)
    return defaults


def _as_written(config: DictConfig, key: str, explicit: set[str], defaults: DictConfig) -> str | None:
    """How ``key`` stands in ``config`` as written: ``"set"`` (named on the command line, or a value other than
    the shipped yaml's), ``"follows"`` (an interpolation: it changes with the key it follows), ``"absent"`` (this
    config does not carry it, e.g. a recipe's yaml without that section), or None (the shipped default, which a
    host-aware value may replace).

    The module's only reads of the Hydra config: whether a value was written, and how, is a property of the
    composed yaml that the typed view (resolved, with the schema's defaults filled in) no longer has."""
    if key in explicit:
        return "set"
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent)
    if not isinstance(node, DictConfig) or leaf not in node:
        return "absent"
    if OmegaConf.is_interpolation(node, leaf):
        return "follows"
    return "set" if node[leaf] != OmegaConf.select(defaults, key, default=None) else None


def _set(config: DictConfig, key: str, value) -> None:
    """Write a host-aware value into the Hydra config (the run's typed config is built from it afterwards)."""
    OmegaConf.update(config, key, value, merge=False, force_add=True)


# Ray settings (environment variables read by every Ray process) for a Ray this run starts on a CPU machine:
# name -> (Ray's default, ours, why)
RAY_ENV = {
    NICENESS_ENV: (15, 0, "on CPU the Ray workers do the compute; at Ray's default nice 15 any other busy process "
                          "on the machine preempts them"),
    INLINE_ARGS_ENV: (100 * 1024, 1024 * 1024, "a step's batches (a few hundred KB for small models) travel with the "
                                               "call instead of through the object store (a tiny model's GRPO step: "
                                               "about 4 ms less)"),
}


def foreground_ray_workers() -> tuple[list, list]:
    """Set :data:`RAY_ENV` for a Ray this process starts (``RAY_worker_niceness=0``: Ray's default runs workers at
    nice 15, and on a CPU machine the workers do the compute; larger inline call arguments). A value the user set,
    or a cluster's (``RAY_ADDRESS``), is kept. Returns (kept, changed) entries in the host-defaults block's
    format."""
    kept, changed = [], []
    if os.environ.get("RAY_ADDRESS"):
        return kept, changed
    for name, (ray_default, ours, why) in RAY_ENV.items():
        if name in os.environ:
            kept.append((f"{name} (environment)", os.environ[name], "set by you"))
        else:
            os.environ[name] = str(ours)
            changed.append((f"{name} (environment)", ray_default, ours, why))
    return kept, changed


def resolve_rollout_tp(config: DictConfig, device: str, explicit: set[str] | None = None,
                       defaults: DictConfig | None = None, hf_only: bool = False,
                       rollout: RolloutConfig | None = None) -> tuple | None:
    """verl's default engine tensor-parallel size (2), when the user did not set it, becomes 1 where it cannot or
    should not apply (module docstring); returns the ``(key, old, new, why)`` change, or None. The driver applies
    it with the host-aware defaults; the config check applies the HF part again (``hf_only``) for callers that
    validate a composed config directly (a config the driver resolved is unchanged by it). ``rollout``: the typed
    rollout section, when the caller has built it (otherwise built here from that section alone: the config check
    runs this on every validation)."""
    rollout = rollout if rollout is not None else build(RolloutConfig, config.actor_rollout_ref.rollout)
    tp = rollout.tensor_model_parallel_size
    if not isinstance(tp, int) or tp == 1:
        return None
    defaults = defaults if defaults is not None else _shipped_defaults()
    if _as_written(config, ROLLOUT_TP_KEY, explicit or set(), defaults) is not None:
        return None
    if rollout.name == "hf":
        why = "HF generate runs one model per process (no tensor parallelism)"
    elif device == "cpu" and rollout.name == "vllm" and not hf_only:
        why = ("on CPU the engines share the same cores either way: one independent engine per worker process, no "
               "all-reduce per layer")
    else:
        return None
    _set(config, ROLLOUT_TP_KEY, 1)
    return ROLLOUT_TP_KEY, tp, 1, why


COMPILE_KEYS = (f"{AR}.actor.use_torch_compile", f"{AR}.actor.fsdp_config.use_torch_compile",
                f"{AR}.ref.use_torch_compile", f"{AR}.ref.fsdp_config.use_torch_compile",
                "critic.model.fsdp_config.use_torch_compile")


def resolve_torch_compile(config: DictConfig, device: str, explicit: set[str] | None = None,
                          defaults: DictConfig | None = None, typed: PPOTrainerConfig | None = None) -> list[tuple]:
    """verl's default ``use_torch_compile=True``, when the user did not set it, becomes False on CPU: compiling
    the decoder layers costs 10-45 s per worker process before the first step, more than it saves on the short
    CPU runs (measured in the engine docs). A value you set is used as set; a key that follows another (the
    reference's follows the actor's) changes with it. Returns the ``(key, old, new, why)`` changes. ``typed``: the
    config's typed view, when the caller has built it."""
    if device != "cpu":
        return []
    typed = as_ppo_config(config, typed)
    defaults = defaults if defaults is not None else _shipped_defaults()
    changes = []
    for key in COMPILE_KEYS:
        if attrgetter(key)(typed) is not True or _as_written(config, key, explicit or set(), defaults) is not None:
            continue
        _set(config, key, False)
        changes.append((key, True, False, "on CPU compiling the decoder layers costs 10-45 s per worker process "
                                          "before the first step; the model runs eagerly"))
    return changes


RM_MICRO_KEY = "reward_model.micro_batch_size_per_gpu"
LOG_PROB_MICRO_KEY = f"{AR}.rollout.log_prob_micro_batch_size_per_gpu"


def resolve_reward_model_micro_batch(config: DictConfig, typed: PPOTrainerConfig | None = None):
    """An enabled reward model with no micro batch (verl's reward-loop scripts set none: its reward server batches
    by itself) scores in micro-batches of the rollout's log-prob pass, a forward over the same sequences. Returns
    the change made, or None. ``typed``: the config's typed view, when the caller has built it."""
    typed = as_ppo_config(config, typed)
    rm = typed.reward_model
    if not rm.enable or rm.use_dynamic_bsz:
        return None
    if rm.micro_batch_size_per_gpu is not None or rm.micro_batch_size is not None:
        return None
    micro = typed.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
    if micro is None:
        return None  # validation names both keys
    _set(config, RM_MICRO_KEY, int(micro))
    return (RM_MICRO_KEY, None, int(micro), f"unset: the reward model scores in micro-batches of the rollout's "
                                            f"log-prob pass ({LOG_PROB_MICRO_KEY})")


LORA_KEYS = {"lora_rank": "r", "lora_alpha": "lora_alpha", "target_modules": "target_modules"}


def resolve_lora_adapter(config: DictConfig, typed: PPOTrainerConfig | None = None) -> list:
    """``model.lora_adapter_path`` (a PEFT adapter directory, as verl's lora_from_adapter script passes alone): the
    adapter's rank, alpha and target modules become ``model.lora_rank`` / ``lora_alpha`` / ``target_modules``, which
    the engine, the rollout and the reference (the adapter-free base) read. Keys the user set to other values are
    left for validation to name. Returns the changes made. ``typed``: the config's typed view, when the caller has
    built it."""
    typed = as_ppo_config(config, typed)
    model = typed.actor_rollout_ref.model
    if not model.lora_adapter_path or model.lora_rank:  # a rank of 0 (verl's default) or null: not set
        return []
    try:
        with open(os.path.join(os.path.expanduser(str(model.lora_adapter_path)), "adapter_config.json")) as f:
            adapter = json.load(f)
    except (OSError, ValueError):
        return []  # validation names the missing or unreadable adapter
    changes = []
    for key, field_name in LORA_KEYS.items():
        value = adapter.get(field_name)
        if value is None:
            continue
        value = sorted(value) if isinstance(value, (list, set, tuple)) else value
        full = f"{AR}.model.{key}"
        old = getattr(model, key)
        if old != value:
            _set(config, full, value)
            changes.append((full, old, value, f"from the adapter at {AR}.model.lora_adapter_path"))
    return changes


def resolve_host_defaults(config: DictConfig, explicit: set[str] | None = None,
                          defaults: DictConfig | None = None) -> HostChoices:
    """Apply the host-aware choices to ``config`` (in place, before validation); see the module docstring."""
    try:
        # built once: every decision below reads it; the changes go to ``config``, which no decision reads back
        # except through _as_written (a key that follows a changed one is left to follow it)
        typed = build(PPOTrainerConfig, config)
        device = resolve_device(typed.trainer.device)
    except (OmegaConfBaseException, ValueError):  # a broken interpolation, a bad trainer.device: validation
        return HostChoices(device="unknown")      # reports it with the key
    choices = HostChoices(device=device)
    explicit = explicit or set()
    defaults = defaults if defaults is not None else _shipped_defaults()
    change = resolve_rollout_tp(config, device, explicit, defaults, rollout=typed.actor_rollout_ref.rollout)
    if change is not None:
        choices.changed.append(change)
    choices.changed.extend(resolve_torch_compile(config, device, explicit, defaults, typed=typed))
    change = resolve_reward_model_micro_batch(config, typed=typed)
    if change is not None:
        choices.changed.append(change)
    choices.changed.extend(resolve_lora_adapter(config, typed=typed))
    if device != "cpu":
        return choices
    choices.isa = _cpu_isa()
    choices.native_bf16 = cpu_has_native_bf16()
    memory = psutil.virtual_memory().total
    choices.memory_gib = memory / 1024**3

    for key in COMPUTE_DTYPE_KEYS:
        value = attrgetter(key)(typed)
        if str(value).lower() not in _HALF or choices.native_bf16:
            continue
        written = _as_written(config, key, explicit, defaults)
        if written == "set":
            choices.kept.append((key, value, "set by you; bf16 is emulated on this CPU and runs 10-20x slower"))
        elif written is None:
            _set(config, key, "fp32")
            choices.changed.append((key, value, "fp32", "bf16 is emulated on this CPU (no AVX-512 BF16 / AMX): "
                                                       "10-20x slower than fp32"))

    for key, path_key in CHECKPOINTING_KEYS.items():
        if not attrgetter(key)(typed) or _as_written(config, key, explicit, defaults) is not None:
            continue
        weights = _weights_bytes(attrgetter(path_key)(typed))
        if weights and 8 * weights < memory / 2:
            _set(config, key, False)
            choices.changed.append((key, True, False, f"model weights {weights / 1024**2:.0f} MiB: training state and "
                                                      "activations fit in memory, recomputing them only costs time"))

    ranks = _count(typed.trainer.n_gpus_per_node) * _count(typed.trainer.nnodes)
    for key in RESHARD_KEYS:
        if ranks != 1 or attrgetter(key)(typed) is not True:
            continue
        if _as_written(config, key, explicit, defaults) is not None:
            continue
        _set(config, key, False)
        choices.changed.append((key, True, False, "one process: its shard is the whole model, so resharding after "
                                "forward only repeats the parameter gather in backward (measured -10% update time)"))

    samples = _count(typed.actor_rollout_ref.rollout.n)
    if (samples > 1 and typed.actor_rollout_ref.actor.strategy in ("fsdp", "fsdp2")
            and typed.actor_rollout_ref.model.share_prompt_prefix is False
            and _as_written(config, SHARE_PREFIX_KEY, explicit, defaults) is None):
        _set(config, SHARE_PREFIX_KEY, True)
        choices.changed.append((SHARE_PREFIX_KEY, False, True, f"rollout.n={samples}: the samples of a prompt run "
                                "the prompt once in the actor and reference forwards (same log-probs)"))
    if (samples > 1 and need_critic(typed) and typed.critic.strategy in ("fsdp", "fsdp2")
            and typed.critic.model.share_prompt_prefix is False
            and _as_written(config, CRITIC_SHARE_PREFIX_KEY, explicit, defaults) is None):
        _set(config, CRITIC_SHARE_PREFIX_KEY, True)
        choices.changed.append((CRITIC_SHARE_PREFIX_KEY, False, True, f"rollout.n={samples}: the samples of a "
                                "prompt run the prompt once in the value forward and the critic update (same values)"))

    kept, changed = foreground_ray_workers()
    choices.kept.extend(kept)
    choices.changed.extend(changed)

    if (typed.actor_rollout_ref.actor.old_log_prob_source == "trainer"
            and _as_written(config, OLD_LOG_PROB_KEY, explicit, defaults) is None):
        blocker = old_log_prob_update_blocker(config, typed)
        if blocker is None:
            _set(config, OLD_LOG_PROB_KEY, "update")
            choices.changed.append((OLD_LOG_PROB_KEY, "trainer", "update", "one epoch x one mini-batch: the update's "
                                    "own forward gives the same old log-probs, one forward pass fewer per step"))
        else:
            choices.kept.append((OLD_LOG_PROB_KEY, "trainer", blocker))
    return choices
