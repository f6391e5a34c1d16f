"""Offline DPO-family training as a short driver over one worker group (policy + reference + rollout).

Features and how to turn them on (``recipe/dpo/config/dpo_trainer.yaml``):

- loss: ``dpo.loss_type`` = sigmoid (DPO) | ipo | hinge on pairs (``prompt``, ``chosen``, ``rejected``), or
  kto on unpaired completions (``prompt``, ``completion``, ``label``) with ``dpo.desirable_weight`` /
  ``dpo.undesirable_weight``; ``dpo.beta``; ``dpo.label_smoothing`` > 0 for conservative DPO
  (``verl.trainer.preference.losses`` names each paper). KTO rows travel as pairs ``[y_i, y'_i]`` where ``y'_i``
  is the prompt with another prompt's completion: its log-ratio gives the reference point (no gradient);
- reference log-probs: once for the whole training set (``dpo.precompute_ref_log_probs=true``) or every
  step; LoRA actors (``actor_rollout_ref.model.lora_rank``) use the base model with adapters off;
- prompt sharing (``dpo.share_prompt_prefix``, default true, pairwise losses): each pair is computed as one
  packed sequence ``[prompt | chosen | rejected]`` whose rejected tokens attend to the prompt and to themselves
  only, so the prompt runs once per pair in the policy forward/backward and in the reference forward (same
  log-probs as two rows; ``verl.workers.engine.shared_prompt``). Models or attention kernels where that is not
  known to be exact keep two rows per pair, with one log line saying why; KTO rows always do;
- batches: ``data.train_batch_size`` pairs per optimizer step, ``dpo.micro_batch_size_per_gpu`` pairs per
  forward/backward (a pair never splits; dynamic batch sizes are refused), ``dpo.ppo_epochs`` passes;
- validation every ``trainer.test_freq`` steps on ``data.val_files``: ``val/rewards/{chosen,rejected,
  accuracies,margins}``, ``val/logps/{chosen,rejected}``, ``val/loss`` and, with ``dpo.greedy_eval``,
  ``val/greedy_accuracy`` (greedy answer == chosen answer); KTO logs ``rewards/{chosen,rejected,margins}``,
  ``logps/{chosen,rejected}`` over desirable / undesirable completions, ``kl`` (the reference point) and, on
  validation, ``rewards/accuracies`` over (desirable, undesirable) completions of the same prompt;
- checkpoints every ``trainer.save_freq`` steps, resume with ``trainer.resume_mode``; the final policy is
  written as a Hugging Face directory ``<trainer.default_local_dir>/huggingface``.
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.trainer.preference import (PAIRWISE_LOSSES, REF_KEY, KTOLoss, PairwisePreferenceLoss, kto_metrics,
                                     pairwise_loss, preference_metrics, same_prompt_accuracy)
from verl.trainer.preference.dataset import PreferenceDataError, PreferenceDataset, UnpairedPreferenceDataset
from verl.trainer.recipe_driver import RecipeDriver
from verl.utils.config import ConfigError
from verl.utils.metric import reduce_metrics
from verl.workers.preference_worker import PreferenceWorker

__all__ = ["DPOTrainer", "build_loss", "kto_weight_warning"]

def build_loss(dpo: DictConfig):
    """The engine loss function of ``dpo.loss_type`` (a ConfigError naming the key and the choices otherwise)."""
    loss_type = str(dpo.loss_type)
    try:
        if loss_type == "kto":
            if float(dpo.get("label_smoothing", 0.0) or 0.0) != 0.0:
                raise ValueError("label_smoothing applies to loss_type=sigmoid only; set dpo.label_smoothing=0 "
                                 "with kto")
            return KTOLoss(float(dpo.beta), float(dpo.get("desirable_weight", 1.0)),
                           float(dpo.get("undesirable_weight", 1.0)))
        if loss_type not in PAIRWISE_LOSSES:
            raise ValueError(f"loss_type={loss_type!r} is not a pairwise preference loss nor kto; choose one of "
                             f"{', '.join(PAIRWISE_LOSSES)} (paired prompt/chosen/rejected rows) or kto (unpaired "
                             "prompt/completion/label rows)")
        return PairwisePreferenceLoss(loss_type, float(dpo.beta), float(dpo.label_smoothing))
    except ValueError as e:
        raise ConfigError(f"dpo: {e}") from None


def kto_weight_warning(n_desirable: int, n_undesirable: int, desirable_weight: float,
                       undesirable_weight: float) -> str | None:
    """The KTO paper's advice (as TRL checks it): ``desirable_weight * n_D / (undesirable_weight * n_U)`` should
    lie in [1, 4/3]. A message suggesting weights when it does not, None when it does."""
    ratio = desirable_weight * n_desirable / (undesirable_weight * n_undesirable)
    if 1.0 <= ratio <= 4.0 / 3.0:
        return None
    low = undesirable_weight * n_undesirable / n_desirable
    high = 4.0 / 3.0 * low
    return (f"KTO: {n_desirable} desirable and {n_undesirable} undesirable training rows with dpo.desirable_weight="
            f"{desirable_weight} and dpo.undesirable_weight={undesirable_weight} give a weighted ratio of {ratio:.2f}; "
            f"the KTO paper suggests 1 to 4/3 (e.g. dpo.desirable_weight between {low:.2f} and {high:.2f})")


def _pair_rows(indices: list[int]) -> list[int]:
    """Rows of the interleaved layout that hold the pairs ``indices``."""
    return [r for i in indices for r in (2 * i, 2 * i + 1)]


class DPOTrainer(RecipeDriver):
    """``__init__`` checks the config and loads the data (errors before any worker starts); ``init_workers``
    spawns the policy group; ``fit`` (from ``RecipeDriver``) runs ``step``."""

    def __init__(self, config: DictConfig, tokenizer):
        super().__init__(config)
        dpo = config.dpo
        self.loss = build_loss(dpo)
        if not isinstance(dpo.get("share_prompt_prefix", True), bool):
            raise ConfigError(f"dpo.share_prompt_prefix={dpo.share_prompt_prefix!r}: set true (pairs run as one "
                              "packed [prompt | chosen | rejected] sequence) or false (two rows per pair)")
        self.kto = isinstance(self.loss, KTOLoss)
        try:
            self.setup_pairs(tokenizer, dpo.micro_batch_size_per_gpu, config.actor_rollout_ref.actor.use_dynamic_bsz,
                             epochs=dpo.ppo_epochs, micro_key="dpo.micro_batch_size_per_gpu",
                             dataset_cls=UnpairedPreferenceDataset if self.kto else PreferenceDataset)
        except PreferenceDataError as e:
            if "missing column" not in str(e):
                raise
            wanted = ("dpo.loss_type=kto reads unpaired rows (prompt, completion, label); paired rows "
                      "(prompt, chosen, rejected) take sigmoid, ipo or hinge" if self.kto else
                      f"dpo.loss_type={dpo.loss_type} reads paired rows (prompt, chosen, rejected); unpaired rows "
                      "(prompt, completion, label) take dpo.loss_type=kto")
            raise PreferenceDataError(f"{e} [{wanted}]") from None
        if self.kto:
            n_good = sum(self.train.labels)
            warning = kto_weight_warning(n_good, len(self.train) - n_good, self.loss.desirable_weight,
                                         self.loss.undesirable_weight)
            if warning:
                print(warning, flush=True)
        self.ref_cache: dict[str, torch.Tensor] = {}
        self.share_prompt = False

    def init_workers(self) -> None:
        self.start_ray()
        self.policy = self.spawn("actor", PreferenceWorker, config=self.config.actor_rollout_ref,
                                 role="actor_rollout_ref")
        self.share_prompt = self._shared_prompt_decision()
        if self.share_prompt:
            self.spec = dataclasses.replace(self.spec, shared_prompt=True)

    def _shared_prompt_decision(self) -> bool:
        """Whether pairs run as packed [prompt | chosen | rejected] rows (``dpo.share_prompt_prefix``)."""
        if not bool(self.config.dpo.get("share_prompt_prefix", True)):
            return False
        if self.kto:
            print("dpo.share_prompt_prefix: KTO rows are unpaired completions; each is computed as its own row",
                  flush=True)
            return False
        reasons = [r for r in self.policy.shared_prompt_support() if r]
        if reasons:
            print(f"dpo.share_prompt_prefix: {reasons[0]}; computing chosen and rejected as separate rows "
                  "(the prompt runs twice per pair)", flush=True)
            return False
        print("dpo.share_prompt_prefix: each pair runs as one packed [prompt | chosen | rejected] sequence",
              flush=True)
        return True

    # ------------------------------------------------------------------ the method
    def step(self) -> dict:
        start = time.perf_counter()
        pairs, idx = self.next_pairs()                               # rows [y_w, y_l] per prompt x, interleaved
        pairs.batch[REF_KEY] = self.reference_logps("train", pairs, idx)   # log pi_ref(y | x)
        out = self.policy.update_with_loss(self.loss, pairs)         # -log sigmoid(beta * (h_w - h_l)), one step
        metrics = reduce_metrics(out.meta_info["metrics"])
        metrics["timing_s/step"] = time.perf_counter() - start        # wall clock of the step, validation excluded
        return {f"train/{k}" if k.startswith(("rewards/", "logps/")) or k == "kl" else k: v
                for k, v in metrics.items()}

    # ------------------------------------------------------------------ helpers
    def _seq_logps(self, method: str, data: DataProto, key: str) -> torch.Tensor:
        data.meta_info["average"] = self.loss.average_logps
        data.meta_info["share_prompt"] = self.share_prompt
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
        if self.kto:
            return self._validate_kto(pairs, policy, ref, idx)
        pc, pr, rc, rr = policy[0::2], policy[1::2], ref[0::2], ref[1::2]
        loss, rew_c, rew_r = pairwise_loss(self.loss.loss_type)(pc, pr, rc, rr, beta=self.loss.beta,
                                                                 label_smoothing=self.loss.label_smoothing)
        metrics = {f"val/{k}": float(v) for k, v in preference_metrics(rew_c, rew_r, pc, pr).items()}
        metrics["val/loss"] = float(loss.mean())
        if bool(self.config.dpo.get("greedy_eval", True)):
            metrics["val/greedy_accuracy"] = self.greedy_accuracy(self.val, idx)
        return metrics

    def _validate_kto(self, rows: DataProto, policy: torch.Tensor, ref: torch.Tensor, idx: list[int]) -> dict:
        """KTO on the whole validation set at once (one reference point from all its mismatched rows)."""
        loss, reward, z, pol, good = self.loss.rows(policy, ref, rows.batch["label"])
        metrics = {f"val/{k}": float(v) for k, v in kto_metrics(reward, pol, good).items()}
        accuracy = same_prompt_accuracy([tuple(self.val.prompt_ids[i]) for i in idx], reward, good)
        if accuracy is not None:
            metrics["val/rewards/accuracies"] = accuracy
        metrics["val/kl"] = float(z)
        metrics["val/loss"] = float(loss.mean())
        if bool(self.config.dpo.get("greedy_eval", True)):
            prompt_rows = {}
            for i in idx:  # one greedy answer per prompt that has a desirable completion
                if self.val.labels[i]:
                    prompt_rows.setdefault(tuple(self.val.prompt_ids[i]), i)
            if prompt_rows:
                metrics["val/greedy_accuracy"] = self.greedy_accuracy(self.val, list(prompt_rows.values()))
        return metrics

    def greedy_accuracy(self, data, idx: list[int]) -> float:
        """Share of prompts whose greedy answer (up to eos) is exactly the chosen answer (KTO: one of the
        prompt's desirable completions)."""
        prompts = data.prompts(idx)
        prompts.meta_info.update(do_sample=False, validate=True)
        out = self.call(self.policy, "generate_sequences", prompts)
        answers = self.tokenizer.batch_decode(out.batch["responses"], skip_special_tokens=True)
        if isinstance(data, UnpairedPreferenceDataset):
            return sum(a.strip() in w for a, w in zip(answers, data.desirable_texts(idx))) / max(len(idx), 1)
        wanted = data.chosen_texts(idx)
        return sum(a.strip() == w.strip() for a, w in zip(answers, wanted)) / max(len(idx), 1)

    def finish(self) -> None:
        out_dir = os.path.join(self.checkpoint_root(), "huggingface")
        self.policy.save_hf_model(out_dir)
        print(f"saved the trained policy to {out_dir}", flush=True)
