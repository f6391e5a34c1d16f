"""The PPO trainer's worker groups: which roles run (actor + rollout, critic, reference, reward model), their
resource pools, one colocated Ray worker group per pool, and the order the models are built in
(``RayPPOTrainer`` mixes this in)."""

from __future__ import annotations

from typing import Any

from verl.single_controller.ray import RayClassWithInitArgs, create_colocated_worker_cls
from verl.trainer.ppo.utils import Role

__all__ = ["WorkerGroupsMixin"]


class WorkerGroupsMixin:
    """``init_workers`` and the two steps it is made of (override ``_worker_specs`` to run other roles). Expects
    ``config``, ``role_worker_mapping``, ``resource_pool_manager``, ``ray_worker_group_cls`` and the ``use_*`` /
    ``ref_in_actor`` flags on the trainer."""

    def _worker_specs(self) -> list[tuple[Role, str, dict]]:
        """(role, worker-group name, init kwargs) of every worker group this trainer runs."""
        specs = [(Role.ActorRollout, "actor_rollout", dict(config=self.config.actor_rollout_ref, role="actor_rollout"))]
        if self.use_critic:
            specs.append((Role.Critic, "critic", dict(config=self.config.critic)))
        if self.use_reference_policy and not self.ref_in_actor:
            specs.append((Role.RefPolicy, "ref", dict(config=self.config.actor_rollout_ref, role="ref")))
        if self.use_rm:
            specs.append((Role.RewardModel, "rm", dict(config=self.config.reward_model)))
        return specs

    def _spawn_worker_groups(self, specs: list[tuple[Role, str, dict]]) -> dict[str, Any]:
        """Create the resource pools and one colocated worker group per pool for ``specs``; by name."""
        self.resource_pool_manager.create_resource_pool()
        pool_to_classes: dict[Any, dict[str, RayClassWithInitArgs]] = {}
        for which, name, init_kwargs in specs:
            pool = self.resource_pool_manager.get_resource_pool(which)
            pool_to_classes.setdefault(pool, {})[name] = RayClassWithInitArgs(cls=self.role_worker_mapping[which],
                                                                              **init_kwargs)
        timeout = int(self.config.trainer.get("ray_wait_register_center_timeout", 300))
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

