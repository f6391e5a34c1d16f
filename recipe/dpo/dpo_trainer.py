"""Offline DPO-family training as a short driver over one worker group (policy + reference + rollout).

Features and how to turn them on (``recipe/dpo/config/dpo_trainer.yaml``):

- loss: ``dpo.loss_type`` = sigmoid (DPO) | ipo | hinge; ``dpo.beta``; ``dpo.label_smoothing`` > 0 for
  conservative DPO (``verl.trainer.preference.losses`` names each paper);
- reference log-probs: once for the whole training set (``dpo.precompute_ref_log_probs=true``) or every
  step; LoRA actors (``actor_rollout_ref.model.lora_rank``) use the base model with adapters off;
- batches: ``data.train_batch_size`` pairs per optimizer step, ``dpo.micro_batch_size_per_gpu`` pairs per
  forward/backward (a pair never splits; dynamic batch sizes are refused), ``dpo.ppo_epochs`` passes;
- validation every ``trainer.test_freq`` steps on ``data.val_files``: ``val/rewards/{chosen,rejected,
  accuracies,margins}``, ``val/logps/{chosen,rejected}``, ``val/loss`` and, with ``dpo.greedy_eval``,
  ``val/greedy_accuracy`` (greedy answer == chosen answer);
- checkpoints every ``trainer.save_freq`` steps, resume with ``trainer.resume_mode``; the final policy is
  written as a Hugging Face directory ``<trainer.default_local_dir>/huggingface``.
"""

from __future__ import annotations

import os
import time

import torch
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.trainer.preference import REF_KEY, PairwisePreferenceLoss, pairwise_loss, preference_metrics
from verl.trainer.preference.driver import RecipeDriver
from verl.utils.config import ConfigError
from verl.trainer.preference.dataset import PreferenceDataset
from verl.utils.metric import reduce_metrics
from verl.workers.preference_worker import PreferenceWorker

__all__ = ["DPOTrainer"]


def _pair_rows(indices: list[int]) -> list[int]:
    """Rows of the interleaved layout that hold the pairs ``indices``."""
    return [r for i in indices for r in (2 * i, 2 * i + 1)]


class DPOTrainer(RecipeDriver):
    """``__init__`` checks the config and loads the data (errors before any worker starts); ``init_workers``
    spawns the policy group; ``fit`` (from ``RecipeDriver``) runs ``step``."""

    def __init__(self, config: DictConfig, tokenizer):
        super().__init__(config)
        dpo = config.dpo
        try:
            self.loss = PairwisePreferenceLoss(str(dpo.loss_type), float(dpo.beta), float(dpo.label_smoothing))
        except ValueError as e:
            raise ConfigError(f"dpo: {e}") from None
        self.setup_pairs(tokenizer, dpo.micro_batch_size_per_gpu, config.actor_rollout_ref.actor.use_dynamic_bsz,
                         epochs=dpo.ppo_epochs, micro_key="dpo.micro_batch_size_per_gpu")
        self.ref_cache: dict[str, torch.Tensor] = {}

    def init_workers(self) -> None:
        self.start_ray()
        self.policy = self.spawn("actor", PreferenceWorker, config=self.config.actor_rollout_ref,
                                 role="actor_rollout_ref")

    # ------------------------------------------------------------------ the method
    def step(self) -> dict:
        start = time.perf_counter()
        pairs, idx = self.next_pairs()                               # rows [y_w, y_l] per prompt x, interleaved
        pairs.batch[REF_KEY] = self.reference_logps("train", pairs, idx)   # log pi_ref(y | x)
        out = self.policy.update_with_loss(self.loss, pairs)         # -log sigmoid(beta * (h_w - h_l)), one step
        metrics = reduce_metrics(out.meta_info["metrics"])
        metrics["timing_s/step"] = time.perf_counter() - start        # wall clock of the step, validation excluded
        return {f"train/{k}" if k.startswith(("rewards/", "logps/")) else k: v for k, v in metrics.items()}

    # ------------------------------------------------------------------ helpers
    def _seq_logps(self, method: str, data: DataProto, key: str) -> torch.Tensor:
        data.meta_info["average"] = self.loss.average_logps
        return self.call(self.policy, method, data).batch[key]

    def reference_logps(self, split: str, pairs: DataProto, idx: list[int]) -> torch.Tensor:
        """Reference log-probs of ``pairs``: from the cache of the whole split, or computed now."""
        if not bool(self.config.dpo.precompute_ref_log_probs):
            return self._seq_logps("compute_ref_seq_logps", pairs, "ref_logps")
        if split not in self.ref_cache:
            data = self.train if split == "train" else self.val
            self.ref_cache[split] = self._seq_logps("compute_ref_seq_logps", data.pairs(range(len(data))), "ref_logps")
        return self.ref_cache[split][_pair_rows(idx)]

    def validate(self) -> dict:
        if self.val is None:
            return {}
        idx = list(range(len(self.val)))
        pairs = self.val.pairs(idx)
        ref = self.reference_logps("val", pairs, idx)
        policy = self._seq_logps("compute_seq_logps", pairs, "logps")
        pc, pr, rc, rr = policy[0::2], policy[1::2], ref[0::2], ref[1::2]
        loss, rew_c, rew_r = pairwise_loss(self.loss.loss_type)(pc, pr, rc, rr, beta=self.loss.beta,
                                                                 label_smoothing=self.loss.label_smoothing)
        metrics = {f"val/{k}": float(v) for k, v in preference_metrics(rew_c, rew_r, pc, pr).items()}
        metrics["val/loss"] = float(loss.mean())
        if bool(self.config.dpo.get("greedy_eval", True)):
            metrics["val/greedy_accuracy"] = self.greedy_accuracy(self.val, idx)
        return metrics

    def greedy_accuracy(self, data: PreferenceDataset, idx: list[int]) -> float:
        """Share of prompts whose greedy answer (up to eos) is exactly the chosen answer."""
        prompts = data.prompts(idx)
        prompts.meta_info.update(do_sample=False, validate=True)
        out = self.call(self.policy, "generate_sequences", prompts)
        answers = self.tokenizer.batch_decode(out.batch["responses"], skip_special_tokens=True)
        wanted = data.chosen_texts(idx)
        return sum(a.strip() == w.strip() for a, w in zip(answers, wanted)) / max(len(idx), 1)

    def finish(self) -> None:
        out_dir = os.path.join(self.checkpoint_root(), "huggingface")
        self.policy.save_hf_model(out_dir)
        print(f"saved the trained policy to {out_dir}", flush=True)
