"""The TaskRunner: the Ray actor that ``python -m verl.trainer.main_ppo`` starts to build and run the trainer.

It builds the tokenizer, worker classes, role -> resource-pool mapping, reward functions and datasets, then runs
``RayPPOTrainer.init_workers()`` and ``.fit()``. It lives apart from the entry point so that the driver process
(which only checks the config, starts Ray and waits) does not import the trainer, the workers or transformers:
a config error comes back in about 3 s instead of 8, and every run starts that much sooner.
``verl.trainer.main_ppo.TaskRunner`` still names this class.
"""

from __future__ import annotations

import os
import socket
from pprint import pprint

import ray
from omegaconf import DictConfig, OmegaConf

from verl.single_controller.ray import RayWorkerGroup
from verl.trainer.config_schema import PPOPlan, validate_ppo_config
from verl.trainer.config_schema.ppo import PPOTrainerConfig
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager, Role
from verl.trainer.ppo.reward import RewardLoop, load_reward_manager
from verl.utils.config import ConfigError
from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset, create_rl_sampler
from verl.utils.fs import copy_to_local
from verl.utils.tokenizer import hf_processor, hf_tokenizer
from verl.workers import engine_workers as role_workers
from verl.workers import megatron_workers
from verl.workers.engine import engine_workers

def resource_pools(plan: PPOPlan, placement: str = "colocate") -> tuple[dict, dict]:
    """Role -> pool mapping and pool sizes: ``({pool: [procs per node] * nnodes}, {Role: pool})``."""
    trainer, reward_model = plan.config.trainer, plan.config.reward_model
    nnodes, per_node = int(trainer.nnodes), int(trainer.n_gpus_per_node)
    actor_role = Role.ActorRollout
    if placement == "colocate":
        spec = {"global_pool": [per_node] * nnodes}
        actor_pool = critic_pool = "global_pool"
    elif placement == "split":
        if per_node >= 2:
            half = [per_node // 2] * nnodes
            spec = {"actor_rollout_ref_pool": half, "critic_pool": half}
        elif nnodes >= 2:
            spec = {"actor_rollout_ref_pool": [per_node] * (nnodes // 2), "critic_pool": [per_node] * (nnodes // 2)}
        else:
            raise ConfigError("split placement needs trainer.n_gpus_per_node >= 2 or trainer.nnodes >= 2")
        actor_pool, critic_pool = "actor_rollout_ref_pool", "critic_pool"
    else:
        raise ConfigError(f"placement={placement!r} is not one of: colocate, split")
    mapping = {actor_role: actor_pool}
    if plan.use_critic:
        mapping[Role.Critic] = critic_pool
    if plan.use_reference_policy and not plan.ref_in_actor:
        mapping[Role.RefPolicy] = actor_pool
    if plan.use_rm:
        if reward_model.enable_resource_pool:
            spec["reward_pool"] = [int(reward_model.n_gpus_per_node)] * int(reward_model.nnodes)
            mapping[Role.RewardModel] = "reward_pool"
        else:
            mapping[Role.RewardModel] = critic_pool
    return spec, mapping


def worker_classes(config: PPOTrainerConfig):
    """(ActorRolloutRefWorker, CriticWorker, RewardModelWorker, worker-group class) for the strategy.

    ``trainer.use_legacy_worker_impl`` (auto | enable | disable) chooses between verl's two worker generations;
    here one set of workers, built on the training-engine interface, serves every value. The strategy's registration
    says which: verl's fsdp/fsdp2 and a user's ``register_engine(name, cls)`` run in the FSDP workers (each
    process holds its own rows), megatron and ``register_engine(name, cls, workers="megatron")`` in the Megatron
    workers. ``config``: the run's config, typed (``PPOPlan.config``)."""
    legacy = str(config.trainer.use_legacy_worker_impl)
    if legacy != "auto":
        print(f"trainer.use_legacy_worker_impl={legacy}: the engine-based workers serve every value of this switch")
    strategy = config.actor_rollout_ref.actor.strategy
    try:
        workers = megatron_workers if engine_workers(strategy) == "megatron" else role_workers
    except ValueError as e:
        raise ConfigError(f"actor_rollout_ref.actor.{e}") from None
    return workers.ActorRolloutRefWorker, workers.CriticWorker, workers.RewardModelWorker, RayWorkerGroup


class TaskRunner:
    """Builds everything the trainer needs inside one Ray actor, then trains. A recipe's runner subclass sets
    ``trainer_cls`` to its RayPPOTrainer subclass (recipe/dapo)."""

    trainer_cls = None  # None: RayPPOTrainer

    def run(self, config: DictConfig, placement: str = "colocate") -> None:
        print(f"TaskRunner on {socket.gethostname()}, pid {os.getpid()}")
        OmegaConf.resolve(config)
        plan = validate_ppo_config(config)  # imports actor_rollout_ref.model.external_lib and plugins first
        print_config(config)

        tokenizer, processor = load_tokenizer_and_processor(plan.config)

        actor_cls, critic_cls, rm_cls, wg_cls = worker_classes(plan.config)
        role_worker_mapping = {Role.ActorRollout: ray.remote(actor_cls)}
        if plan.use_critic:
            role_worker_mapping[Role.Critic] = ray.remote(critic_cls)
        if plan.use_reference_policy and not plan.ref_in_actor:
            role_worker_mapping[Role.RefPolicy] = ray.remote(actor_cls)
        if plan.use_rm:
            role_worker_mapping[Role.RewardModel] = ray.remote(rm_cls)
        spec, mapping = resource_pools(plan, placement)
        print(f"Resource pools: {spec}; roles: { {role.name: pool for role, pool in mapping.items()} }")
        resource_pool_manager = ResourcePoolManager(resource_pool_spec=spec, mapping=mapping)

        reward_model = plan.config.reward_model
        reward_kwargs = dict(reward_model.reward_kwargs)  # free-form: the reward manager's own arguments
        reward_fn = load_reward_manager(plan.config, tokenizer, num_examine=0, **reward_kwargs)
        val_reward_fn = load_reward_manager(plan.config, tokenizer, num_examine=1, **reward_kwargs)
        num_reward_workers = int(reward_model.num_workers)
        if num_reward_workers > 1:  # the reward function scores slices of each batch in that many Ray actors
            reward_fn = RewardLoop(reward_fn, num_reward_workers)
            val_reward_fn = RewardLoop(val_reward_fn, num_reward_workers)
            print(f"Reward function: {num_reward_workers} reward-loop workers score each batch in parallel")

        train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor, is_train=True)
        val_dataset = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor, is_train=False)
        train_sampler = create_rl_sampler(config.data, train_dataset)

        trainer = (self.trainer_cls or RayPPOTrainer)(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=role_worker_mapping,
            resource_pool_manager=resource_pool_manager,
            ray_worker_group_cls=wg_cls,
            reward_fn=reward_fn,
            val_reward_fn=val_reward_fn,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=train_sampler,
            device_name=plan.device,
            typed_config=plan.config,
        )
        trainer.init_workers()
        trainer.fit()


def print_config(config: DictConfig) -> None:
    """One summary line of the run's config; the whole resolved config (~400 lines) with ``VERL_PRINT_CONFIG=1``.

    ``python -m verl.trainer.main_ppo <overrides> --cfg job`` prints the composed config without running."""
    if os.environ.get("VERL_PRINT_CONFIG", "").lower() in ("1", "true", "yes"):
        pprint(OmegaConf.to_container(config, resolve=True))
        return
    rollout, trainer = config.actor_rollout_ref.rollout, config.trainer
    loggers = trainer.logger if isinstance(trainer.logger, str) else list(trainer.logger)
    print(f"Config: algorithm.adv_estimator={config.algorithm.adv_estimator} "
          f"actor_rollout_ref.model.path={config.actor_rollout_ref.model.path} rollout.name={rollout.name} "
          f"rollout.n={rollout.n} data.train_batch_size={config.data.train_batch_size} "
          f"trainer.total_training_steps={trainer.total_training_steps} trainer.logger={loggers} "
          "(set VERL_PRINT_CONFIG=1 to print the full config)", flush=True)


def load_tokenizer_and_processor(config: PPOTrainerConfig):
    """The policy's tokenizer and processor (``config``: the run's config, typed)."""
    model_cfg = config.actor_rollout_ref.model
    path = copy_to_local(model_cfg.tokenizer_path or model_cfg.path, use_shm=model_cfg.use_shm)
    trust = bool(config.data.trust_remote_code or model_cfg.trust_remote_code)
    tokenizer = hf_tokenizer(path, trust_remote_code=trust)
    processor = hf_processor(path, trust_remote_code=trust, use_fast=True)
    template = model_cfg.custom_chat_template
    if template is not None:  # the prompts are rendered with it too (data.chat_template, when set, still wins)
        tokenizer.chat_template = template
        if processor is not None:
            processor.chat_template = template
    return tokenizer, processor


