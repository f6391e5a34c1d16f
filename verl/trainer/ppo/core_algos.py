"""Core PPO-family algorithms: advantage estimators, policy/value/entropy losses, KL penalties and controllers.

The math lives in three modules, all re-exported here so ``from verl.trainer.ppo.core_algos import X`` works:

- :mod:`verl.trainer.ppo.advantage`   ``AdvantageEstimator``, ``register_adv_est``, ``get_adv_estimator_fn``,
  ``compute_{gae_advantage_return, grpo, grpo_passk, rloo, opo, reinforce_plus_plus(_baseline), remax, gpg}...``
- :mod:`verl.trainer.ppo.policy_loss` ``agg_loss``, ``register_policy_loss``, ``get_policy_loss_fn``,
  ``compute_policy_loss`` (+ vanilla, gspo, gpg, clip_cov, kl_cov, geo_mean, cispo), ``compute_entropy_loss``,
  ``compute_value_loss``
- :mod:`verl.trainer.ppo.kl`          ``kl_penalty``, ``AdaptiveKLController``, ``FixedKLController``,
  ``get_kl_controller``

This module adds the two driver-side steps that act on a whole batch (a ``DataProto``):
:func:`apply_kl_penalty` (KL in the reward) and :func:`compute_advantage`; PF-PPO's batch resampling
``compute_pf_ppo_reweight_data`` lives in :mod:`verl.trainer.ppo.pf_ppo`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch

from verl.trainer.ppo.advantage import *  # noqa: F401,F403
from verl.trainer.ppo.advantage import __all__ as _adv_all
from verl.trainer.ppo.advantage import AdvantageEstimator, get_adv_estimator_fn
from verl.trainer.ppo.kl import *  # noqa: F401,F403
from verl.trainer.ppo.kl import __all__ as _kl_all
from verl.trainer.ppo.kl import kl_penalty as _kl_penalty_fn
from verl.trainer.ppo.pf_ppo import compute_pf_ppo_reweight_data
from verl.trainer.ppo.policy_loss import *  # noqa: F401,F403
from verl.trainer.ppo.policy_loss import __all__ as _loss_all
from verl.utils import torch_functional as verl_F
from verl.utils.padding import response_mask

if TYPE_CHECKING:
    from verl.protocol import DataProto

__all__ = [*_adv_all, *_loss_all, *_kl_all, "compute_advantage", "apply_kl_penalty", "compute_pf_ppo_reweight_data",
           "compute_rewards"]


def compute_rewards(token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
                    kl_ratio: float) -> torch.Tensor:
    """KL-shaped token rewards with the k1 estimator: r_t = score_t - kl_ratio * (log pi_old - log pi_ref)."""
    return token_level_scores - kl_ratio * (old_log_prob - ref_log_prob)


def _response_mask(data: "DataProto") -> torch.Tensor:
    """``response_mask`` from the batch, else the response part of ``attention_mask`` (stored back)."""
    if "response_mask" not in data.batch.keys():
        data.batch["response_mask"] = response_mask(data)
    return data.batch["response_mask"]


def apply_kl_penalty(data: "DataProto", kl_ctrl, kl_penalty: str = "kl"):
    """KL-shaped reward (Ziegler et al. 2019; InstructGPT): r_t = score_t - beta * KL_t(pi_old || pi_ref).

    Reads ``token_level_scores``, ``old_log_probs``, ``ref_log_prob``, ``response_mask``; writes
    ``token_level_rewards``; feeds the batch-mean sequence KL to ``kl_ctrl.update``. Returns
    ``(data, {"actor/reward_kl_penalty": mean KL, "actor/reward_kl_penalty_coeff": beta})``.
    """
    mask = _response_mask(data)
    scores = data.batch["token_level_scores"]
    kld = _kl_penalty_fn(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty) * mask
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = scores - beta * kld

    current_kl = verl_F.masked_mean(kld, mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=scores.shape[0])
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_advantage(
    data: "DataProto",
    adv_estimator,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> "DataProto":
    """Fill ``advantages`` and ``returns`` in ``data.batch`` with the registered estimator ``adv_estimator``.

    Inputs: ``token_level_rewards``, ``response_mask`` (else derived from ``attention_mask``), ``values``
    (GAE), ``non_tensor_batch["uid"]`` (group estimators), ``reward_baselines`` (ReMax). ``config`` is the typed
    ``algorithm`` section (``verl.trainer.config_schema.ppo.AlgorithmConfig``, read by attribute) or None; each
    estimator gets the arguments its signature accepts. ``num_repeat`` is kept for verl compatibility (the group
    structure comes from ``uid``). With ``config.use_pf_ppo`` and GAE the batch is resampled by
    :func:`compute_pf_ppo_reweight_data` afterwards (``config.pf_ppo``).
    """
    name = adv_estimator.value if isinstance(adv_estimator, AdvantageEstimator) else str(adv_estimator)
    fn = get_adv_estimator_fn(name)
    mask = _response_mask(data)

    available = {
        "token_level_rewards": data.batch["token_level_rewards"],
        "response_mask": mask,
        "config": config,
        "gamma": gamma,
        "lam": lam,
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
    }
    if "uid" in data.non_tensor_batch:
        available["index"] = data.non_tensor_batch["uid"]
    for key in ("values", "reward_baselines"):
        if key in data.batch.keys():
            available[key] = data.batch[key]

    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in available.items() if takes_any or k in params}
    missing = [
        p.name
        for p in params.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.name not in kwargs
    ]
    if missing:
        hint = {"index": 'non_tensor_batch["uid"]', "values": 'batch["values"] (enable the critic)',
                "reward_baselines": 'batch["reward_baselines"] (ReMax greedy baseline)'}
        raise ValueError(
            f"advantage estimator {name!r} needs {[hint.get(m, m) for m in missing]} which the batch does not have"
        )

    advantages, returns = fn(**kwargs)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns

    if name == AdvantageEstimator.GAE.value and config is not None and config.use_pf_ppo:
        data = compute_pf_ppo_reweight_data(
            data, reweight_method=config.pf_ppo.reweight_method, weight_pow=config.pf_ppo.weight_pow
        )
    return data
