"""The PPO trainer's worker groups: which roles run (actor + rollout, critic, reference, reward model), their
resource pools, one colocated Ray worker group per pool, and the order the models are built in
(``RayPPOTrainer`` mixes this in)."""

from __future__ import annotations

import inspect
from typing import Any

from verl.single_controller.ray import RayClassWithInitArgs, create_colocated_worker_cls
from verl.trainer.ppo.utils import Role
from verl.workers.config.roles import actor_rollout_ref_sections, critic_sections, reward_model_sections

__all__ = ["WorkerGroupsMixin"]


class WorkerGroupsMixin:
    """``init_workers`` and the two steps it is made of (override ``_worker_specs`` to run other roles). Expects
    ``config``, ``role_worker_mapping``, ``resource_pool_manager``, ``ray_worker_group_cls`` and the ``use_*`` /
    ``ref_in_actor`` flags on the trainer."""

    def _worker_specs(self) -> list[tuple[Role, str, dict]]:
        """(role, worker-group name, init kwargs) of every worker group this trainer runs: each gets its config
        section as given (``config``) and the typed sections it reads, built here once (``typed``)."""
        arr = self._actor_rollout_ref_sections()
        specs = [(Role.ActorRollout, "actor_rollout",
                  dict(config=self.config.actor_rollout_ref, role="actor_rollout", typed=arr))]
        if self.use_critic:
            critic = critic_sections(self.config.critic, self.total_training_steps)
            specs.append((Role.Critic, "critic", dict(config=self.config.critic, typed=critic)))
        if self.use_reference_policy and not self.ref_in_actor:
            specs.append((Role.RefPolicy, "ref", dict(config=self.config.actor_rollout_ref, role="ref", typed=arr)))
        if self.use_rm:
            rm = reward_model_sections(self.config.reward_model)
            specs.append((Role.RewardModel, "rm", dict(config=self.config.reward_model, typed=rm)))
        return specs

    def _actor_rollout_ref_sections(self):
        """``actor_rollout_ref`` typed for its workers; the actor's LR schedule spans ``total_training_steps``."""
        return actor_rollout_ref_sections(self.config.actor_rollout_ref, self.total_training_steps)

    def _spawn_worker_groups(self, specs: list[tuple[Role, str, dict]]) -> dict[str, Any]:
        """Create the resource pools and one colocated worker group per pool for ``specs``; by name."""
        self.resource_pool_manager.create_resource_pool()
        pool_to_classes: dict[Any, dict[str, RayClassWithInitArgs]] = {}
        for which, name, init_kwargs in specs:
            pool = self.resource_pool_manager.get_resource_pool(which)
            cls = self.role_worker_mapping[which]
            pool_to_classes.setdefault(pool, {})[name] = RayClassWithInitArgs(cls=cls, **_accepted(cls, init_kwargs))
        timeout = int(self.typed_config.trainer.ray_wait_register_center_timeout)
        all_wg: dict[str, Any] = {}
        self.wg_dicts = []
        for pool, class_dict in pool_to_classes.items():
            worker_dict_cls = create_colocated_worker_cls(class_dict=class_dict)
            wg_dict = self.ray_worker_group_cls(resource_pool=pool, ray_cls_with_init=worker_dict_cls,
                                                ray_wait_register_center_timeout=timeout)
            all_wg.update(wg_dict.spawn(prefix_set=class_dict.keys()))
            self.wg_dicts.append(wg_dict)
        return all_wg

    def init_workers(self) -> None:
        """Create the resource pools and one colocated worker group per pool, then build the models."""
        all_wg = self._spawn_worker_groups(self._worker_specs())

        self.critic_wg = self.ref_policy_wg = self.rm_wg = None
        if self.use_critic:
            self.critic_wg = all_wg["critic"]
            self.critic_wg.init_model()
        if self.use_reference_policy and not self.ref_in_actor:
            self.ref_policy_wg = all_wg["ref"]
            self.ref_policy_wg.init_model()
        if self.use_rm:
            self.rm_wg = all_wg["rm"]
            self.rm_wg.init_model()
        # the actor last: a vLLM rollout sizes its KV cache from the memory the other roles left
        self.actor_rollout_wg = all_wg["actor_rollout"]
        self.actor_rollout_wg.init_model()
        if self.ref_in_actor and self.use_reference_policy:
            self.ref_policy_wg = self.actor_rollout_wg



def _accepted(cls, init_kwargs: dict) -> dict:
    """``init_kwargs`` without ``typed`` when the worker class takes neither it nor ``**kwargs`` (a worker written
    for verl's signature ``(config, role)`` builds its typed sections itself)."""
    params = inspect.signature(getattr(cls, "__ray_actor_class__", cls).__init__).parameters
    if "typed" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return init_kwargs
    return {k: v for k, v in init_kwargs.items() if k != "typed"}
