"""The base of every recipe driver (DPO, SimPO, KTO, reward model, GKD, SPIN, online DPO / SPPO, rejection sampling,
and the one-step-off trainer's helpers): what a recipe needs besides its step: Ray, worker groups, logging,
checkpoints, data order, and the pair batches of the preference recipes.

A recipe subclasses :class:`RecipeDriver`, builds its worker groups with :meth:`spawn` and writes ``step()``;
``fit()`` runs ``trainer.total_training_steps`` steps with validation every ``trainer.test_freq`` steps (and
before the first step when ``trainer.val_before_train``), checkpoints every ``trainer.save_freq`` steps and
resumes (``trainer.resume_mode=auto|disable|resume_path``) from the layout of the PPO trainer::

    <trainer.default_local_dir>/global_step_N/<group>/      each worker group's engine checkpoint
    <trainer.default_local_dir>/global_step_N/driver.pt     the driver's state (step, metric history)
    <trainer.default_local_dir>/latest_checkpointed_iteration.txt

Data order is a function of (seed, step): epoch ``e`` is ``randperm(n, seed + e)``, so a resumed run sees the
same batches as an uninterrupted one without saving a dataloader.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import ray
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
from verl.single_controller.ray.base import ResourcePoolManager
from verl.trainer.config_schema.ppo import RecipeTrainerConfig, TrainerConfig
from verl.trainer.config_schema.rollout import RolloutConfig
from verl.trainer.config_schema.spec import build
from verl.trainer.host_defaults import (explicit_override_keys, foreground_ray_workers, resolve_rollout_tp,
                                        resolve_torch_compile)
from verl.trainer.main_ppo import absolutize_local_paths, init_ray
from verl.trainer.ppo.checkpoint import find_latest_ckpt_path, mark_latest, step_folder
from verl.trainer.ppo.utils import Role
from verl.trainer.preference.dataset import PreferenceDataError, PreferenceDataset
from verl.trainer.preference.pairs import pair_train_spec
from verl.utils.config import ConfigError, omega_conf_to_dataclass, quiet_searchpath_warning  # noqa: F401
from verl.utils.device import resolve_device
from verl.utils.model import check_model_dir
from verl.utils.tracking import Tracking
from verl.workers.config.data import PreferenceDataConfig, as_data_config
from verl.workers.config.model import HFModelConfig
from verl.workers.rollout.layout import check_rollout_parallel
from verl.workers.worker_utils import load_tokenizer

__all__ = ["RecipeDriver", "epoch_order", "batch_indices", "make_recipe_driver", "build_recipe_driver", "run_recipe",
           "EXIT_CONFIG_ERROR"]


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(int(seed) + epoch)).tolist()


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Dataset rows of 0-based ``step`` (``batch_size`` rows; whole batches per epoch, the remainder dropped)."""
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise ConfigError(f"the batch ({batch_size} rows) is larger than the training set ({n} rows); lower "
                          "data.train_batch_size")
    epoch, k = divmod(step, per_epoch)
    return epoch_order(n, seed, epoch)[k * batch_size:(k + 1) * batch_size]


class RecipeDriver:
    """Shared driver plumbing; see the module docstring. ``self.groups`` maps names to worker groups that
    are checkpointed (each must offer ``save_checkpoint`` / ``load_checkpoint``)."""

    def __init__(self, config: DictConfig):
        self.config = config
        # ``trainer``, typed once: the loop, checkpoint and placement settings the driver reads
        self.trainer_config: RecipeTrainerConfig = build(RecipeTrainerConfig, config.trainer)
        _rollout_layout_defaults(config, self.trainer_config)  # before any worker starts, however it was reached
        self.global_steps = 0
        self.groups: dict[str, RayWorkerGroup] = {}
        self.metric_history: list[dict] = []
        self.logger = None
        try:
            self.device = resolve_device(self.trainer_config.device)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        os.environ["VERL_DEVICE"] = self.device
        total = self.trainer_config.total_training_steps
        self.total_steps = int(total or 0)
        if self.total_steps <= 0:
            raise ConfigError(f"trainer.total_training_steps={total}: set a number of steps > 0")

    # ------------------------------------------------------------------ setup
    def start_ray(self) -> None:
        absolutize_local_paths(self.config)
        if not ray.is_initialized():
            if self.device == "cpu":
                foreground_ray_workers()
            init_ray(self.config, None)

    def spawn(self, name: str, worker_cls, **init_kwargs) -> RayWorkerGroup:
        """One worker group of ``trainer.n_gpus_per_node`` x ``trainer.nnodes`` processes running ``worker_cls``."""
        per_node, nnodes = int(self.trainer_config.n_gpus_per_node), int(self.trainer_config.nnodes)
        manager = ResourcePoolManager(resource_pool_spec={f"{name}_pool": [per_node] * nnodes},
                                      mapping={Role.ActorRollout: f"{name}_pool"})
        manager.create_resource_pool()
        pool = manager.get_resource_pool(Role.ActorRollout)
        group = RayWorkerGroup(resource_pool=pool,
                               ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(worker_cls), **init_kwargs))
        group.init_model()
        self.groups[name] = group
        return group

    def setup_pairs(self, tokenizer, micro_pairs: int, use_dynamic_bsz: bool = False, epochs: int = 1,
                    outputs: tuple[str, ...] = ("log_probs",), grad_norm_key: str = "actor/grad_norm",
                    micro_key: str = "micro_batch_size_per_gpu", dataset_cls=PreferenceDataset) -> None:
        """Load ``data.train_files`` / ``data.val_files`` with ``dataset_cls`` (anything with ``pairs(indices)``
        in the interleaved layout) and derive the pair TrainSpec: errors (batch arithmetic, bad rows) surface
        here, before any worker starts."""
        data, tr = self.config.data, self.config.trainer
        world = int(tr.n_gpus_per_node) * int(tr.nnodes)
        self.batch_size = int(data.train_batch_size)
        if self.batch_size % world:
            raise ConfigError(f"data.train_batch_size={self.batch_size} pairs must divide over {world} processes "
                              "(trainer.n_gpus_per_node x trainer.nnodes)")
        try:
            self.spec = pair_train_spec(self.batch_size // world, int(micro_pairs), bool(use_dynamic_bsz),
                                        outputs=outputs, epochs=int(epochs), key_prefix=micro_key)
        except ValueError as e:
            raise ConfigError(f"{e} (data.train_batch_size, {micro_key}, use_dynamic_bsz)") from None
        self.spec = dataclasses.replace(self.spec, grad_norm_key=grad_norm_key)
        self.tokenizer = tokenizer
        self.seed = int(self.trainer_config.seed or 0)
        typed = as_data_config(data, PreferenceDataConfig)
        self.train = dataset_cls(data.train_files, tokenizer, data, int(typed.train_max_samples))
        self.val = (dataset_cls(data.val_files, tokenizer, data, int(typed.val_max_samples))
                    if typed.val_files else None)
        batch_indices(len(self.train), self.batch_size, self.seed, 0)  # a batch larger than the data fails here

    def next_pairs(self) -> tuple[DataProto, list[int]]:
        """This step's training pairs (interleaved rows) and their dataset indices."""
        idx = batch_indices(len(self.train), self.batch_size, self.seed, self.global_steps)
        pairs = self.train.pairs(idx)
        pairs.meta_info["train_spec"] = self.spec
        return pairs, idx

    @staticmethod
    def call(group: RayWorkerGroup, method: str, data: DataProto) -> DataProto:
        """``group.<method>(data)`` (DP_COMPUTE_PROTO) on any number of rows: padded to the group size, unpadded."""
        padded, pad = pad_dataproto_to_divisor(data, group.world_size)
        return unpad_dataproto(getattr(group, method)(padded), pad)

    # ------------------------------------------------------------------ hooks
    def step(self) -> dict:
        raise NotImplementedError

    def validate(self) -> dict:
        return {}

    def finish(self) -> None:
        """After the last step (a recipe writes its final artefacts here)."""

    # ------------------------------------------------------------------ loop
    def _due(self, freq, last: bool) -> bool:
        freq = int(freq or -1)
        return last or (freq > 0 and self.global_steps % freq == 0)

    def fit(self) -> dict:
        tr = self.trainer_config
        loggers = [tr.logger] if isinstance(tr.logger, str) else list(tr.logger)
        self.logger = Tracking(tr.project_name, tr.experiment_name, default_backend=loggers,
                               config=OmegaConf.to_container(self.config, resolve=True))
        self.load_checkpoint()
        last = {}
        if self.global_steps == 0 and bool(tr.val_before_train):
            val = self.validate()
            if val:
                self.logger.log(val, step=0)
                self.metric_history.append({"step": 0, **val})
        while self.global_steps < self.total_steps:
            metrics = self.step()
            self.global_steps += 1
            is_last = self.global_steps >= self.total_steps
            if self._due(tr.test_freq, is_last):
                metrics.update(self.validate())
            self.logger.log(metrics, step=self.global_steps)
            self.metric_history.append({"step": self.global_steps, **metrics})
            if self._due(tr.save_freq, False) or (is_last and int(tr.save_freq or -1) > 0):
                self.save_checkpoint()
            last = metrics
        self.finish()
        self.logger.finish()
        return last

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_root(self) -> str:
        return os.path.abspath(os.path.expanduser(str(self.trainer_config.default_local_dir)))

    def save_checkpoint(self) -> str:
        folder = step_folder(self.checkpoint_root(), self.global_steps)
        for name, group in self.groups.items():
            group.save_checkpoint(os.path.join(folder, name), None, self.global_steps)
        os.makedirs(folder, exist_ok=True)
        torch.save({"global_steps": self.global_steps, "metric_history": self.metric_history},
                   os.path.join(folder, "driver.pt"))
        mark_latest(self.checkpoint_root(), self.global_steps)  # last: a crash leaves the previous step latest
        print(f"saved checkpoint {folder}", flush=True)
        return folder

    def load_checkpoint(self) -> int:
        mode = self.trainer_config.resume_mode
        if mode == "disable":
            return 0
        if mode == "auto":
            folder = find_latest_ckpt_path(self.checkpoint_root())
            if folder is None:
                return 0
        elif mode == "resume_path":
            folder = os.path.abspath(os.path.expanduser(str(self.trainer_config.resume_from_path)))
        else:
            raise ConfigError(f"trainer.resume_mode={mode!r} is not one of: auto, disable, resume_path")
        state_path = os.path.join(folder, "driver.pt")
        if not os.path.exists(state_path):
            raise ConfigError(f"{folder} has no driver.pt: not a checkpoint of this recipe (trainer.resume_from_path)")
        for name, group in self.groups.items():
            group.load_checkpoint(os.path.join(folder, name))
        state = torch.load(state_path, weights_only=False)
        self.global_steps = int(state["global_steps"])
        self.metric_history = list(state.get("metric_history", []))
        print(f"resumed from {folder} (step {self.global_steps})", flush=True)
        return self.global_steps


EXIT_CONFIG_ERROR = 2


def _rollout_layout_defaults(config: DictConfig, trainer: TrainerConfig) -> None:
    """verl's default rollout engine size (2), when not set, becomes 1 for hf and on CPU (as in main_ppo); the
    layout is checked before any worker starts (a ValueError naming the key)."""
    rollout = config.actor_rollout_ref.rollout  # the node the defaults are written into
    if OmegaConf.is_missing(rollout, "name") or rollout.get("name") is None:
        with open_dict(rollout):
            rollout.name = "hf"  # what the policy worker builds when the recipe names no engine
    device = resolve_device(trainer.device)
    change = resolve_rollout_tp(config, device, explicit_override_keys())
    for key, old, new, why in ([change] if change is not None else []) + resolve_torch_compile(
            config, device, explicit_override_keys()):
        print(f"{key}: {old} -> {new} ({why})", flush=True)
    layout = build(RolloutConfig, rollout)  # typed after the defaults above were written
    check_rollout_parallel(name=str(layout.name), tp=int(layout.tensor_model_parallel_size),
                           dp=int(layout.data_parallel_size), ep=int(layout.expert_parallel_size), workers=int(trainer.n_gpus_per_node) * int(trainer.nnodes), model_path=None)


def make_recipe_driver(config: DictConfig, driver_cls):
    """Resolve ``config``, load the tokenizer and build ``driver_cls(config, tokenizer)``: every check a recipe
    makes before it starts anything. A config, data or path problem raises :class:`ConfigError` with a message
    that names the key, file or value; nothing is started or written. ``--check-config`` runs exactly this."""
    OmegaConf.resolve(config)
    try:
        model = omega_conf_to_dataclass(config.actor_rollout_ref.model, HFModelConfig)
        path = check_model_dir(str(model.tokenizer_path or model.path))
        tokenizer = load_tokenizer(path, bool(model.trust_remote_code))
        return driver_cls(config, tokenizer)
    except ConfigError:
        raise
    except (PreferenceDataError, FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from e


def build_recipe_driver(config: DictConfig, driver_cls):
    """:func:`make_recipe_driver` the command-line way: a problem is one ``Config error:`` line on stderr and exit
    code 2."""
    try:
        return make_recipe_driver(config, driver_cls)
    except ConfigError as e:
        print(f"Config error: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG_ERROR)


def run_recipe(config: DictConfig, driver_cls) -> dict:
    """:func:`build_recipe_driver`, then start the workers and train. Returns the last step's metrics."""
    driver = build_recipe_driver(config, driver_cls)
    started_ray = not ray.is_initialized()
    driver.init_workers()
    try:
        return driver.fit()
    finally:
        if started_ray and ray.is_initialized():
            ray.shutdown()
