"""Step metrics from the agent loop's per-sample fields (``__num_turns__``, ``__tool_calls__``, ...).

``num_turns/{min,max,mean}`` (verl's names; a turn is the prompt, each model turn and each tool / user turn),
``agent_loop/tool_calls/{mean,max}`` (calls per episode), ``agent_loop/tool_errors/{sum,mean}`` (calls that
failed: malformed, unknown tool, raised, timed out, refused over ``max_parallel_calls``),
``agent_loop/tool_error_rate``, ``agent_loop/masked_tokens/{mean,max}`` (response tokens the model did not write:
tool results, user turns, environment feedback; they have ``response_mask`` 0), ``agent_loop/agent_reward/mean``
(over samples whose loop returned its own reward), ``agent_loop/unknown_agent_name`` (samples whose
``agent_name`` was not registered and ran the default loop),
``timing_s/agent_loop/{generate_sequences,tool_calls}/{min,max,mean}``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["agent_loop_metrics"]


def _values(batch, key):
    arr = batch.non_tensor_batch.get(key)
    if arr is None:
        return None
    vals = [float(v) for v in arr if v is not None]
    return np.array(vals, dtype=np.float64) if vals else None


def _masked_tokens(batch):
    """Per sample: response tokens the model did not write (attended, ``response_mask`` 0)."""
    tensors = getattr(batch, "batch", None)
    if tensors is None or "response_mask" not in tensors.keys() or "attention_mask" not in tensors.keys():
        return None
    mask = tensors["response_mask"]
    attended = tensors["attention_mask"][:, -mask.shape[-1]:]
    return (attended.sum(-1) - mask.sum(-1)).double().numpy()


def agent_loop_metrics(batch, prefix: str = "") -> dict[str, float]:
    """Metrics for a batch that came from the agent loop (empty for a batch rollout)."""
    out: dict[str, float] = {}
    turns = _values(batch, "__num_turns__")
    if turns is None:
        return out
    out.update({f"{prefix}num_turns/min": float(turns.min()), f"{prefix}num_turns/max": float(turns.max()),
                f"{prefix}num_turns/mean": float(turns.mean())})
    calls = _values(batch, "__tool_calls__")
    errors = _values(batch, "__tool_errors__")
    if calls is not None:
        out[f"{prefix}agent_loop/tool_calls/mean"] = float(calls.mean())
        out[f"{prefix}agent_loop/tool_calls/max"] = float(calls.max())
    if errors is not None:
        out[f"{prefix}agent_loop/tool_errors/sum"] = float(errors.sum())
        out[f"{prefix}agent_loop/tool_errors/mean"] = float(errors.mean())
        if calls is not None:
            out[f"{prefix}agent_loop/tool_error_rate"] = float(errors.sum() / calls.sum()) if calls.sum() else 0.0
    masked = _masked_tokens(batch)
    if masked is not None:
        out[f"{prefix}agent_loop/masked_tokens/mean"] = float(masked.mean())
        out[f"{prefix}agent_loop/masked_tokens/max"] = float(masked.max())
    agent_rewards = _values(batch, "__reward_score__")
    if agent_rewards is not None:
        out[f"{prefix}agent_loop/agent_reward/mean"] = float(agent_rewards.mean())
    unknown = _values(batch, "__unknown_agent__")
    if unknown is not None:
        out[f"{prefix}agent_loop/unknown_agent_name"] = float(unknown.sum())
    for key, name in (("__generate_s__", "generate_sequences"), ("__tool_s__", "tool_calls")):
        vals = _values(batch, key)
        if vals is not None:
            out.update({f"{prefix}timing_s/agent_loop/{name}/min": float(vals.min()),
                        f"{prefix}timing_s/agent_loop/{name}/max": float(vals.max()),
                        f"{prefix}timing_s/agent_loop/{name}/mean": float(vals.mean())})
    return out
