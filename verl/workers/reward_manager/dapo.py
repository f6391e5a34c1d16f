"""``dapo``: per-sample scoring plus DAPO's soft overlong punishment (Yu et al., 2025, "DAPO", §3.4).

With a maximum response length ``L_max`` and a buffer ``L_cache`` (``overlong_buffer.len``), a response of
``|y|`` tokens gets an extra reward

    R_length(y) = min(-(|y| - (L_max - L_cache)) / L_cache * penalty_factor, 0)

i.e. 0 up to ``L_max - L_cache`` tokens, then linearly down to ``-penalty_factor`` at ``L_max``.
Config (verl's names): ``reward_model.reward_kwargs.overlong_buffer_cfg.{enable, len, penalty_factor, log}`` and
``reward_model.reward_kwargs.max_resp_len`` (recipe/dapo spells the first ``reward_model.overlong_buffer``;
``load_reward_manager`` accepts both).
"""

from __future__ import annotations

from verl.utils.config import cfg_get
from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample
from verl.workers.reward_manager.registry import register



def overlong_penalty(response_length: int, max_resp_len: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment for one response (<= 0)."""
    expected_len = max_resp_len - buffer_len
    exceed_len = response_length - expected_len
    return min(-exceed_len / buffer_len * penalty_factor, 0.0)


@register("dapo")
class DAPORewardManager(AbstractRewardManager):
    """Like ``naive``, plus the overlong penalty when ``overlong_buffer_cfg.enable``. A float scorer result is
    also reported as ``acc``; with ``overlong_buffer_cfg.log`` the penalty is reported as ``overlong_reward``
    and ``overlong`` (bool) per sample."""

    def __init__(self, tokenizer, num_examine=0, compute_score=None, reward_fn_key="data_source",
                 max_resp_len: int | None = None, overlong_buffer_cfg=None, **reward_kwargs) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, **reward_kwargs)
        self.overlong_buffer_cfg = overlong_buffer_cfg
        self.max_resp_len = max_resp_len
        if cfg_get(overlong_buffer_cfg, "enable", False):
            buffer_len = cfg_get(overlong_buffer_cfg, "len")
            if max_resp_len is None:
                raise ValueError("dapo reward manager: overlong_buffer_cfg.enable=True needs max_resp_len "
                                 "(set reward_model.reward_kwargs.max_resp_len, usually data.max_response_length)")
            if not buffer_len or buffer_len <= 0:
                raise ValueError(f"dapo reward manager: overlong_buffer_cfg.len must be > 0, got {buffer_len!r}")
            if max_resp_len < buffer_len:
                raise ValueError(f"dapo reward manager: max_resp_len ({max_resp_len}) must be >= "
                                 f"overlong_buffer_cfg.len ({buffer_len})")

    def score_samples(self, samples: list[RewardSample]) -> list:
        results = []
        for s in samples:
            r = self.compute_score(**s.score_kwargs(), **self.reward_kwargs)
            results.append(r if isinstance(r, dict) else {"score": float(r), "acc": float(r)})
        return results

    def postprocess(self, samples, scores, extra):
        cfg = self.overlong_buffer_cfg
        if not cfg_get(cfg, "enable", False):
            return scores, extra
        buffer_len, factor = int(cfg_get(cfg, "len")), float(cfg_get(cfg, "penalty_factor", 1.0))
        penalties = [overlong_penalty(s.valid_response_length, int(self.max_resp_len), buffer_len, factor)
                     for s in samples]
        if cfg_get(cfg, "log", False):
            extra["overlong_reward"] = penalties
            extra["overlong"] = [p < 0 for p in penalties]
        return [score + p for score, p in zip(scores, penalties)], extra
