"""On-policy distillation (GKD): ``python -m recipe.gkd.main_gkd key=value ...`` (config:
``config/on_policy_distill_trainer.yaml``).

Agarwal et al. 2024, "On-Policy Distillation of Language Models": the student samples responses to the prompts
(the rollout engine, weights pushed after every update), a frozen teacher scores the student's own tokens,
and the student minimises a per-token divergence to the teacher on them. Losses (``gkd.loss_type``):

- ``jsd``: the generalized Jensen-Shannon divergence with ``gkd.beta`` over the full vocabulary
  (``beta = 0``: forward KL(teacher || student), ``beta = 1``: reverse KL(student || teacher)); the teacher
  sends its full next-token logits;
- ``reverse_kl``: the sampled-token estimator of the reverse KL: with ``d_t = log q(y_t) - log p(y_t)`` at the
  student's sampled token ``y_t``, the loss ``mean_t(stop_grad(d_t) * log q(y_t))`` has the gradient of
  ``KL(q || p)`` at each position (the score-function form); the teacher sends only its token log-probs.

The teacher is a ``ref`` role on the same training engine, built from ``actor_rollout_ref.teacher.model.path``
(it must share the student's tokenizer / vocabulary); it lives in the student's worker processes (a colocated
worker group, as the reference policy of PPO does) and is not checkpointed.
Validation on ``data.val_files``: ``val/kl_student_teacher`` (the exact per-token KL(student || teacher) over the
vocabulary, averaged over the tokens of student samples) and the student's greedy rule score.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import hydra
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from verl.protocol import DataProto
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls
from verl.single_controller.ray.base import ResourcePoolManager
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.reward import load_reward_manager
from verl.trainer.preference.check_config import check_config_if_asked, check_recipe_command_line
from verl.trainer.recipe_driver import RecipeDriver, quiet_searchpath_warning, run_recipe
from verl.trainer.preference.losses import generalized_jsd, reverse_kl
from verl.trainer.preference.prompt_sampling import prompt_sources, sample_responses, sequence_scores
from verl.utils.config import ConfigError
from verl.utils.metric import reduce_metrics
from verl.utils.model import check_model_dir, load_hf_config
from verl.workers.engine import MicroBatchSpec, TrainSpec
from verl.workers.config.roles import typed_section
from verl.workers.preference_worker import PreferenceWorker

__all__ = ["DistillationLoss", "check_config", "teacher_worker_config", "GKDTrainer", "check_command_line"]

LOSS_TYPES = ("jsd", "reverse_kl")
_TRAIN_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


def _token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


@dataclass(frozen=True)
class DistillationLoss:
    """One micro-batch of student samples carrying ``teacher_logits`` (jsd) or ``teacher_log_probs``
    (reverse_kl); token mean over ``response_mask`` (``weight_by="tokens"``)."""

    loss_type: str = "jsd"
    beta: float = 0.5
    temperature: float = 1.0

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"gkd.loss_type={self.loss_type!r} is not one of: {', '.join(LOSS_TYPES)}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"gkd.beta={self.beta}: choose a value in [0, 1]")
        if self.temperature <= 0:
            raise ValueError(f"gkd.temperature={self.temperature}: must be > 0")

    @property
    def outputs(self) -> tuple[str, ...]:
        return ("logits",) if self.loss_type == "jsd" else ("log_probs",)

    def __call__(self, outputs, micro, ctx=None):
        mask = micro["response_mask"].float()
        if self.loss_type == "jsd":
            student, teacher = outputs["logits"], micro["teacher_logits"].to(outputs["logits"].dtype)
            loss = _token_mean(generalized_jsd(student, teacher, self.beta, self.temperature), mask)
            kl = _token_mean(reverse_kl(student.detach(), teacher, self.temperature), mask)
        else:
            log_q = outputs["log_probs"]
            d = (log_q - micro["teacher_log_probs"].to(log_q.dtype)).detach()
            loss = _token_mean(d * log_q, mask)
            kl = _token_mean(d, mask)  # sampled-token estimate of KL(q || p)
        return loss, {"gkd/loss": loss.detach(), "gkd/reverse_kl": kl}


def check_config(config: DictConfig) -> DistillationLoss:
    """The loss from ``gkd.*`` and the teacher keys, checked before any worker starts (errors name the key)."""
    gkd, teacher = config.gkd, config.actor_rollout_ref.get("teacher")
    try:
        loss = DistillationLoss(str(gkd.loss_type), float(gkd.beta), float(gkd.temperature))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if teacher is None or not (teacher.get("model") or {}).get("path"):
        raise ConfigError("actor_rollout_ref.teacher.model.path is not set: point it at the teacher's model "
                          "directory (a causal LM with the student's tokenizer)")
    if teacher.get("server_ip") or teacher.get("server_port"):
        raise ConfigError("actor_rollout_ref.teacher.server_ip/server_port: this recipe runs the teacher as a "
                          "worker group from actor_rollout_ref.teacher.model.path, not as a server; unset them")
    for key in ("micro_batch_size_per_gpu", "epochs"):
        if int(gkd[key]) < 1:
            raise ConfigError(f"gkd.{key}={gkd[key]}: must be >= 1")
    return loss


def _plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def teacher_worker_config(config: DictConfig) -> DictConfig:
    """The ``actor_rollout_ref``-shaped section a ``ref`` worker reads for the teacher: its model, its
    ``fsdp_config`` and log-prob micro-batch as the reference policy's, the student's actor keys for sharding."""
    arr, teacher = config.actor_rollout_ref, config.actor_rollout_ref.teacher
    path = os.path.expanduser(str(teacher.model.path))
    model = {"path": os.path.abspath(path) if os.path.exists(path) else path, "trust_remote_code": bool(typed_section(teacher.model, "actor_rollout_ref.model").trust_remote_code),
             "override_config": _plain(teacher.model.get("override_config")),
             "tokenizer_path": arr.model.get("tokenizer_path") or str(arr.model.path)}
    ref = {"fsdp_config": _plain(teacher.get("fsdp_config")),
           "log_prob_micro_batch_size_per_gpu": int(teacher.log_prob_micro_batch_size_per_gpu)}
    return OmegaConf.create({"model": model, "ref": ref, "actor": _plain(arr.actor)})


class GKDTrainer(RecipeDriver):
    """``__init__`` checks keys, the teacher directory and vocabulary and loads the prompts; ``step`` is one
    sample -> teacher scores -> distillation update."""

    def __init__(self, config: DictConfig, tokenizer):
        super().__init__(config)
        self.loss = check_config(config)
        student = load_hf_config(check_model_dir(str(config.actor_rollout_ref.model.path)))
        teacher = load_hf_config(check_model_dir(str(config.actor_rollout_ref.teacher.model.path)))
        if student.vocab_size != teacher.vocab_size:
            raise ConfigError(f"actor_rollout_ref.teacher.model.path: the teacher's vocabulary ({teacher.vocab_size}"
                              f" tokens) differs from the student's ({student.vocab_size}); distillation compares "
                              "next-token distributions, so both need the same tokenizer")
        self.seed = int(self.trainer_config.seed or 0)
        self.world = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
        rows = int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n)
        if rows % self.world:
            raise ConfigError(f"data.train_batch_size x actor_rollout_ref.rollout.n = {rows} samples must divide over "
                              f"{self.world} processes (trainer.n_gpus_per_node x trainer.nnodes)")
        self.spec = TrainSpec(mini_batch_size=rows // self.world, micro=MicroBatchSpec(int(config.gkd.micro_batch_size_per_gpu)),
                              epochs=int(config.gkd.epochs), weight_by="tokens", mask_key="response_mask",
                              outputs=self.loss.outputs, grad_norm_key="actor/grad_norm",
                              temperature=1.0 if self.loss.loss_type == "jsd" else self.loss.temperature)
        self.prompts, self.val = prompt_sources(config.data, tokenizer, self.seed)
        self.reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
        self.teacher_config = teacher_worker_config(config)

    def init_workers(self) -> None:
        """Student and teacher share the worker processes (as verl's reference policy shares the actor's):
        one process start instead of two; each role still has its own model and engine."""
        self.start_ray()
        per_node, nnodes = int(self.config.trainer.n_gpus_per_node), int(self.config.trainer.nnodes)
        manager = ResourcePoolManager(resource_pool_spec={"gkd_pool": [per_node] * nnodes},
                                      mapping={Role.ActorRollout: "gkd_pool"})
        manager.create_resource_pool()
        roles = create_colocated_worker_cls({
            "actor": RayClassWithInitArgs(cls=PreferenceWorker, config=self.config.actor_rollout_ref,
                                          role="actor_rollout"),
            "teacher": RayClassWithInitArgs(cls=PreferenceWorker, config=self.teacher_config, role="ref")})
        shared = RayWorkerGroup(resource_pool=manager.get_resource_pool(Role.ActorRollout), ray_cls_with_init=roles)
        groups = shared.spawn(prefix_set=["actor", "teacher"])
        self.student, self.teacher = groups["actor"], groups["teacher"]
        self.student.init_model()
        self.teacher.init_model()
        self.groups["actor"] = self.student  # the teacher is frozen: nothing to checkpoint

    # ------------------------------------------------------------------ the method
    def step(self) -> dict:
        start = time.perf_counter()
        samples = sample_responses(self.student, self.prompts.batch(self.global_steps))  # y ~ q_student(. | x)
        batch = DataProto.from_dict({k: samples.batch[k] for k in _TRAIN_KEYS})
        for name in self.loss.outputs:                                                   # p_teacher on y's prefixes
            batch.batch[f"teacher_{name}"] = self.token_outputs(self.teacher, batch, name, self.loss.temperature)
        batch.meta_info["train_spec"] = self.spec
        out = self.student.update_with_loss(self.loss, batch)                           # per-token divergence step
        metrics = reduce_metrics(out.meta_info["metrics"])
        metrics["response_length/mean"] = float(samples.batch["response_mask"].sum(-1).float().mean())
        metrics["timing_s/step"] = time.perf_counter() - start
        return metrics

    # ------------------------------------------------------------------ helpers
    def token_outputs(self, group, batch: DataProto, name: str, temperature: float = 1.0) -> torch.Tensor:
        """Per-token ``name`` (``logits`` / ``log_probs``) of ``batch``'s responses from ``group``."""
        data = DataProto.from_dict({k: batch.batch[k] for k in _TRAIN_KEYS},
                                   meta_info={"outputs": (name,), "temperature": 1.0 if name == "logits" else temperature})
        return self.call(group, "compute_token_outputs", data).batch[name]

    def validate(self) -> dict:
        """Held-out prompts: exact per-token KL(student || teacher) on student samples, and greedy scores."""
        if self.val is None:
            return {}
        prompts = self.val.rows(range(len(self.val)))
        samples = sample_responses(self.student, prompts)
        student = self.token_outputs(self.student, samples, "logits")
        teacher = self.token_outputs(self.teacher, samples, "logits")
        mask = samples.batch["response_mask"].float()
        log_q, log_p = F.log_softmax(student, -1), F.log_softmax(teacher, -1)
        kl = (log_q.exp() * (log_q - log_p)).sum(-1)
        metrics = {"val/kl_student_teacher": float(_token_mean(kl, mask)),
                   "val/kl_student_teacher_per_sequence": float((kl * mask).sum(-1).mean())}
        greedy = sample_responses(self.student, prompts, validate=True)
        scores, _ = sequence_scores(self.reward_fn, greedy)
        metrics["val/student_score"] = float(scores.mean())
        return metrics


def check_command_line(argv: list[str]) -> GKDTrainer:
    """What ``--check-config`` checks, in this process: the driver built from this command line (nothing
    started), or a ConfigError naming the key."""
    return check_recipe_command_line(argv, __file__, "on_policy_distill_trainer", GKDTrainer)


@hydra.main(config_path="config", config_name="on_policy_distill_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_recipe(config, GKDTrainer)


if __name__ == "__main__":
    quiet_searchpath_warning()
    check_config_if_asked(check_command_line)  # --check-config: check, print, exit 0 / 2
    main()
