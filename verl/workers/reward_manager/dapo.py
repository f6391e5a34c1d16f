"""``dapo``: per-sample scoring plus DAPO's soft overlong punishment (Yu et al., 2025, "DAPO", §3.4).

With a maximum response length ``L_max`` and a buffer ``L_cache`` (``overlong_buffer.len``), a response of
``|y|`` tokens gets an extra reward

    R_length(y) = min(-(|y| - (L_max - L_cache)) / L_cache * penalty_factor, 0)

i.e. 0 up to ``L_max - L_cache`` tokens, then linearly down to ``-penalty_factor`` at ``L_max``.
Config (verl's names): ``reward_model.reward_kwargs.overlong_buffer_cfg.{enable, len, penalty_factor, log}`` and
``reward_model.reward_kwargs.max_resp_len`` (recipe/dapo spells the first ``reward_model.overlong_buffer``;
``load_reward_manager`` accepts both). The keys and defaults are
:class:`verl.trainer.config_schema.ppo.OverlongBufferConfig`'s.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.config_schema.ppo import OverlongBufferConfig
from verl.workers.config.base import check_section_values, coerce_section
from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample
from verl.workers.reward_manager.registry import register

OVERLONG_BUFFER_KEY = "reward_model.reward_kwargs.overlong_buffer_cfg"


def overlong_buffer_config(value: Any, key: str = OVERLONG_BUFFER_KEY) -> OverlongBufferConfig:
    """``value`` (a mapping, DictConfig, an ``OverlongBufferConfig`` or None for the defaults) as a checked
    ``OverlongBufferConfig``; an unknown key, a wrong type or a value out of range is a ConfigError naming
    ``<key>.<name>``."""
    cfg = coerce_section(OverlongBufferConfig, value, f"{key}.", strict=True)
    check_section_values(cfg, f"{key}.")
    return cfg


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
        self.overlong_buffer_cfg = cfg = overlong_buffer_config(overlong_buffer_cfg)
        self.max_resp_len = max_resp_len
        if cfg.enable:
            buffer_len = cfg.len
            if max_resp_len is None:
                raise ValueError("dapo reward manager: overlong_buffer_cfg.enable=True needs max_resp_len "
                                 "(set reward_model.reward_kwargs.max_resp_len, usually data.max_response_length)")
            if buffer_len == 0:
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
        if not cfg.enable:
            return scores, extra
        factor = float(cfg.penalty_factor)
        max_len = int(self.max_resp_len)
        penalties = [overlong_penalty(s.valid_response_length, max_len, cfg.len, factor) for s in samples]
        if cfg.log:
            extra["overlong_reward"] = penalties
            extra["overlong"] = [p < 0 for p in penalties]
        return [score + p for score, p in zip(scores, penalties)], extra
