"""Reward-model training as a short driver: Bradley-Terry on a sequence-classification head.

Features (``recipe/reward_model/config/reward_model_trainer.yaml``): ``data.train_batch_size`` pairs per step,
``reward_model_training.micro_batch_size_per_gpu`` pairs per forward/backward, optional per-pair ``margin``
(``reward_model_training.use_margin``), validation every ``trainer.test_freq`` steps (``val/rm/accuracy``: the
share of held-out pairs ranked correctly, ``val/rm/loss``), checkpoints / resume as in every recipe, and the
final model written as a Hugging Face classifier at ``<trainer.default_local_dir>/huggingface``.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig

from verl.trainer.preference import BradleyTerryLoss, bradley_terry_loss
from verl.trainer.recipe_driver import RecipeDriver
from verl.utils.metric import reduce_metrics
from verl.workers.preference_worker import RewardTrainerWorker

__all__ = ["RewardModelTrainer"]


class RewardModelTrainer(RecipeDriver):
    def __init__(self, config: DictConfig, tokenizer):
        super().__init__(config)
        rm = config.reward_model_training
        self.loss = BradleyTerryLoss(use_margin=bool(rm.use_margin))
        self.setup_pairs(tokenizer, rm.micro_batch_size_per_gpu, config.actor_rollout_ref.actor.use_dynamic_bsz,
                         epochs=rm.epochs, outputs=("scores",), grad_norm_key="rm/grad_norm",
                         micro_key="reward_model_training.micro_batch_size_per_gpu")

    def init_workers(self) -> None:
        self.start_ray()
        self.rm = self.spawn("reward_model", RewardTrainerWorker, config=self.config.actor_rollout_ref)

    def step(self) -> dict:
        pairs, _ = self.next_pairs()                       # rows [y_w, y_l] per prompt x, interleaved
        out = self.rm.update_with_loss(self.loss, pairs)   # -log sigmoid(r(x, y_w) - r(x, y_l) [- margin])
        return {f"train/{k}": v for k, v in reduce_metrics(out.meta_info["metrics"]).items()}

    def validate(self) -> dict:
        if self.val is None:
            return {}
        pairs = self.val.pairs(range(len(self.val)))
        scores = self.call(self.rm, "compute_scores", pairs).batch["rm_scores"]
        chosen, rejected = scores[0::2], scores[1::2]
        return {"val/rm/accuracy": float((chosen > rejected).float().mean()),
                "val/rm/loss": float(bradley_terry_loss(chosen, rejected).mean()),
                "val/rm/margin": float((chosen - rejected).mean())}

    def finish(self) -> None:
        out_dir = os.path.join(self.checkpoint_root(), "huggingface")
        self.rm.save_hf_model(out_dir)
        print(f"saved the reward model to {out_dir} (main_ppo: reward_model.enable=True "
              f"reward_model.model.path={out_dir})", flush=True)
