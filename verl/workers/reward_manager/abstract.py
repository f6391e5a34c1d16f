"""Base class and shared plumbing of the rule-based reward managers.

A reward manager turns a rollout batch into token-level scores: it decodes each sample's valid prompt and
response tokens, calls ``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)``
and writes the score at the last valid response token of a (B, R) float tensor (``token_level_scores``).
Subclasses only decide *how* ``compute_score`` is called (one by one, batched, in a process pool) and may
post-process the scores (DAPO's overlong penalty). A sample whose agent loop returned its own reward (non-tensor
``__reward_score__``, e.g. an environment's) gets that reward instead of ``compute_score``'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from verl.utils.reward_score import default_compute_score, is_default_scorer

__all__ = ["AbstractRewardManager", "RewardSample"]


@dataclass
class RewardSample:
    """One decoded sample of a batch, as the scorers see it."""

    index: int
    prompt_str: str
    response_str: str
    valid_response_length: int
    data_source: str
    ground_truth: Any
    extra_info: dict = field(default_factory=dict)

    def score_kwargs(self) -> dict:
        return dict(data_source=self.data_source, solution_str=self.response_str,
                    ground_truth=self.ground_truth, extra_info=self.extra_info)


def _plain(value: Any) -> Any:
    """numpy scalars/arrays from parquet -> plain Python values (scorers compare them with == and str)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


class AbstractRewardManager(ABC):
    """``__init__(tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", **kwargs)``;
    ``__call__(data, return_dict=False)`` -> reward tensor (B, R), or
    ``{"reward_tensor": ..., "reward_extra_info": {key: per-sample list}}`` when ``return_dict``."""

    def __init__(self, tokenizer, num_examine: int = 0, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source", **kwargs) -> None:
        self.tokenizer = tokenizer
        self.num_examine = int(num_examine)
        self.compute_score = compute_score if compute_score is not None else default_compute_score
        # the built-in scorers compare with reward_model.ground_truth; a user's function may do without it
        self.needs_ground_truth = is_default_scorer(self.compute_score)
        self.reward_fn_key = reward_fn_key
        self.reward_kwargs = kwargs

    # -------------------------------------------------------------------------------------- public API
    def __call__(self, data, return_dict: bool = False):
        if "rm_scores" in data.batch.keys():
            # A model-based reward was already computed (RewardModelWorker); pass it through.
            reward_tensor = data.batch["rm_scores"]
            keys = data.meta_info.get("reward_extra_keys", [])
            extra = {k: list(data.non_tensor_batch[k]) for k in keys}
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra} if return_dict else reward_tensor

        agent_scores = data.non_tensor_batch.get("__reward_score__")
        agent_rows = [i for i, v in enumerate(agent_scores) if v is not None] if agent_scores is not None else []
        if agent_rows and len(agent_rows) == len(data):
            # every sample's agent loop returned its own reward (an environment's): nothing to score
            reward_tensor = self._agent_reward_tensor(data, agent_scores, agent_rows)
            return {"reward_tensor": reward_tensor, "reward_extra_info": {}} if return_dict else reward_tensor

        samples = self.decode(data)
        results = self.score_samples(samples)
        if len(results) != len(samples):
            raise ValueError(f"{type(self).__name__}: got {len(results)} scores for {len(samples)} samples")
        scores, extra = self.collect(results)
        scores, extra = self.postprocess(samples, scores, extra)

        reward_tensor = torch.zeros(data.batch["responses"].shape, dtype=torch.float32)
        for sample, score in zip(samples, scores):
            reward_tensor[sample.index, max(sample.valid_response_length - 1, 0)] = score
        if agent_rows:  # samples whose agent loop returned a reward keep it
            reward_tensor = self._agent_reward_tensor(data, agent_scores, agent_rows, reward_tensor)
        self.examine(samples, scores)
        if return_dict:
            out = {"reward_tensor": reward_tensor, "reward_extra_info": dict(extra)}
            metrics = self.batch_metrics()
            if metrics:
                out["reward_metrics"] = metrics
            return out
        return reward_tensor

    @staticmethod
    def _agent_reward_tensor(data, agent_scores, rows: list[int], reward_tensor=None) -> torch.Tensor:
        """The agent loop's ``reward_score`` of ``rows`` at each one's last valid response token."""
        responses = data.batch["responses"]
        if reward_tensor is None:
            reward_tensor = torch.zeros(responses.shape, dtype=torch.float32)
        valid = data.batch["attention_mask"][:, -responses.shape[-1]:].sum(-1).tolist()
        for i in rows:
            reward_tensor[i] = 0.0
            reward_tensor[i, max(int(valid[i]) - 1, 0)] = float(agent_scores[i])
        return reward_tensor

    @abstractmethod
    def score_samples(self, samples: list[RewardSample]) -> list:
        """One result per sample: a float, or a dict with ``"score"`` and extra keys."""

    def postprocess(self, samples: list[RewardSample], scores: list[float], extra: dict) -> tuple[list[float], dict]:
        """Hook to adjust scores after scoring (e.g. length penalties)."""
        return scores, extra

    def batch_metrics(self) -> dict[str, float]:
        """Scalar metrics about the last call (e.g. timeout counts), returned as ``reward_metrics``."""
        return {}

    # -------------------------------------------------------------------------------------- helpers
    def decode(self, data) -> list[RewardSample]:
        """Valid (unpadded) prompt and response text of every sample, with its ground truth and metadata."""
        batch, non_tensor = data.batch, data.non_tensor_batch
        responses = batch["responses"]
        resp_len = responses.shape[-1]
        if "prompts" in batch.keys():
            prompts = batch["prompts"]
        else:
            prompts = batch["input_ids"][:, : batch["input_ids"].shape[-1] - resp_len]
        prompt_len = prompts.shape[-1]
        if "attention_mask" in batch.keys():
            mask = batch["attention_mask"]
            prompt_valid = mask[:, :prompt_len].sum(-1).tolist()
            response_valid = mask[:, prompt_len:prompt_len + resp_len].sum(-1).tolist()
        elif "response_mask" in batch.keys():
            prompt_valid = [prompt_len] * len(responses)
            response_valid = batch["response_mask"].sum(-1).tolist()
        else:
            raise KeyError("reward manager needs batch['attention_mask'] (or batch['response_mask']) to find the "
                           f"valid response tokens; batch has {sorted(batch.keys())}")

        if self.reward_fn_key not in non_tensor:
            raise KeyError(f"non_tensor_batch has no {self.reward_fn_key!r} (data.reward_fn_key names the column "
                           f"that selects the scorer); available: {sorted(non_tensor)}")
        if "reward_model" not in non_tensor and self.needs_ground_truth:
            raise KeyError("non_tensor_batch has no 'reward_model' column (a dict with 'ground_truth' per row), which "
                           f"the built-in scorers compare with; available: {sorted(non_tensor)}. Add it to the data "
                           "or set custom_reward_function.path")

        prompt_ids = [prompts[i, prompt_len - int(n):].tolist() for i, n in enumerate(prompt_valid)]
        response_ids = [responses[i, : int(n)].tolist() for i, n in enumerate(response_valid)]
        prompt_strs = self.tokenizer.batch_decode(prompt_ids, skip_special_tokens=True)
        response_strs = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)

        extra_infos = non_tensor.get("extra_info")
        reward_models = non_tensor.get("reward_model")
        num_turns = non_tensor.get("__num_turns__")
        samples = []
        for i in range(len(responses)):
            extra_info = dict(extra_infos[i]) if extra_infos is not None and extra_infos[i] is not None else {}
            if num_turns is not None:
                extra_info["num_turns"] = _plain(num_turns[i])
            data_source = str(non_tensor[self.reward_fn_key][i])
            cell = reward_models[i] if reward_models is not None else None
            ground_truth = cell.get("ground_truth") if isinstance(cell, Mapping) else None
            if ground_truth is None and self.needs_ground_truth:
                raise KeyError(f"sample {i} (data_source={data_source!r}) has no reward_model.ground_truth, which the "
                               "built-in scorers compare with. Add it to the data or set custom_reward_function.path")
            samples.append(RewardSample(
                index=i, prompt_str=prompt_strs[i], response_str=response_strs[i],
                valid_response_length=int(response_valid[i]), data_source=data_source,
                ground_truth=_plain(ground_truth), extra_info=extra_info,
            ))
        return samples

    @staticmethod
    def collect(results: list) -> tuple[list[float], dict[str, list]]:
        """Split scorer results into reward floats and per-sample extra-info lists.

        A dict result's ``score`` is the reward; all its keys (``score`` included, as verl does) go to
        ``reward_extra_info``. Lists stay aligned with the batch: a sample whose result lacks a key gets
        0.0 for numeric keys and "" otherwise (validation metrics skip string-valued keys).
        """
        scores = [float(r["score"]) if isinstance(r, dict) else float(r) for r in results]
        keys: list[str] = []
        for r in results:
            if isinstance(r, dict):
                keys.extend(k for k in r if k not in keys)
        extra: dict[str, list] = defaultdict(list)
        for key in keys:
            present = [r[key] for r in results if isinstance(r, dict) and key in r]
            numeric = all(isinstance(v, (int, float, bool, np.number)) for v in present)
            fill = 0.0 if numeric else ""
            extra[key] = [r.get(key, fill) if isinstance(r, dict) else fill for r in results]
        if "score" in extra:  # a plain float result is its own score
            extra["score"] = [float(r) if not isinstance(r, dict) else v for r, v in zip(results, extra["score"])]
        return scores, extra

    def examine(self, samples: list[RewardSample], scores: list[float]) -> None:
        """Print up to ``num_examine`` samples per data source (a quick look at what the policy writes), one line
        each; a sample identical to the last one printed for its data source is not printed again (an unchanged
        policy would otherwise repeat the same lines at every validation)."""
        if self.num_examine <= 0:
            return
        shown: dict[str, int] = defaultdict(int)
        last = self.__dict__.setdefault("_last_examined", {})
        for sample, score in zip(samples, scores):
            if shown[sample.data_source] >= self.num_examine:
                continue
            shown[sample.data_source] += 1
            line = (f"[data_source] {sample.data_source} [prompt] {sample.prompt_str!r} [response] "
                    f"{sample.response_str!r} [ground_truth] {sample.ground_truth} [score] {score}")
            if last.get(sample.data_source) == line:
                continue
            last[sample.data_source] = line
            print(line)
