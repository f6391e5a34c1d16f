"""KL estimators between the policy and the reference policy, and KL-coefficient controllers.

Re-exported by ``verl.trainer.ppo.core_algos``. Used both as a reward penalty (``algorithm.kl_penalty``,
``algorithm.kl_ctrl.*``) and as an actor loss (``actor.kl_loss_type``).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "KL_ESTIMATORS",
    "kl_penalty",
    "kl_penalty_forward",
    "AdaptiveKLController",
    "FixedKLController",
    "get_kl_controller",
]

KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the log-probs of the sampled tokens.

    Estimators from Schulman 2020, "Approximating KL Divergence" (log r = logprob - ref_logprob):

    - ``kl`` / ``k1``: log r (unbiased, high variance, can be negative)
    - ``abs``: |log r|
    - ``mse`` / ``k2``: 0.5 * (log r)^2
    - ``low_var_kl`` / ``k3``: (1/r) - 1 + log r = exp(-log r) - 1 + log r (unbiased, >= 0, low variance);
      log r is clamped to [-20, 20] and the result to [-10, 10] for numerical safety (as in GRPO practice).
    - ``full``: exact KL over the vocabulary. It needs *full-vocabulary* log-probabilities, i.e. tensors of
      shape (..., L, V) with the vocabulary last (ndim >= 3); the result has shape (..., L). The trainer
      only carries sampled-token log-probs (B, L), so with those this raises a ValueError naming k1/k2/k3.
    """
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        log_ratio_ref = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
        kld = torch.exp(log_ratio_ref) - log_ratio_ref - 1
        return torch.clamp(kld, min=-10.0, max=10.0)
    if kl_penalty == "full":
        if logprob.dim() < 3 or logprob.shape != ref_logprob.shape:
            raise ValueError(
                "kl_penalty='full' needs full-vocabulary log-probabilities of shape (B, L, V) for both policies, "
                f"got {tuple(logprob.shape)} and {tuple(ref_logprob.shape)}; with per-token log-probs use "
                "'kl'/'k1', 'mse'/'k2' or 'low_var_kl'/'k3'"
            )
        return (logprob.exp() * (logprob - ref_logprob)).sum(dim=-1)
    raise ValueError(
        f"unknown KL estimator {kl_penalty!r} (algorithm.kl_penalty / actor.kl_loss_type); choose one of "
        f"{list(KL_ESTIMATORS)}, optionally with a '+' suffix (e.g. 'k3+') for a k2 straight-through gradient"
    )


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """KL estimate per token (see :func:`kl_penalty_forward` for the names).

    A ``+`` suffix (``"k1+"``, ``"k3+"``, ...) keeps the estimator's value but takes the gradient of k2,
    0.5 * (log r)^2, whose gradient is an unbiased estimate of the true KL gradient (straight-through).
    """
    if kl_penalty.endswith("+"):
        value = kl_penalty_forward(logprob, ref_logprob, kl_penalty[:-1])
        k2 = 0.5 * (logprob - ref_logprob).square()
        return k2 - k2.detach() + value.detach()
    return kl_penalty_forward(logprob, ref_logprob, kl_penalty)


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences").

    beta <- beta * (1 + clip(KL / KL_target - 1, -0.2, 0.2) * n_steps / horizon)
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if not horizon > 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon


class FixedKLController:
    """Constant KL coefficient; ``update`` does nothing."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


def get_kl_controller(kl_ctrl):
    """Build the controller from the typed ``algorithm.kl_ctrl`` section (``type`` fixed|adaptive, ``kl_coef``,
    ``target_kl``, ``horizon``; ``verl.trainer.config_schema.ppo.KLCtrlConfig``), read by attribute as in verl."""
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_coef=kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        return AdaptiveKLController(init_kl_coef=kl_ctrl.kl_coef, target_kl=kl_ctrl.target_kl, horizon=kl_ctrl.horizon)
    raise ValueError(f"unknown algorithm.kl_ctrl.type {kl_ctrl.type!r}; choose 'fixed' or 'adaptive'")
