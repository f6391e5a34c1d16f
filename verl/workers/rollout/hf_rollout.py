"""HFRollout: generation with a plain transformers model, the rollout engine that runs anywhere.

The engine keeps its *own unsharded* copy of the causal LM inside the worker process (loaded from
``model_path`` with ``rollout.dtype``, or handed in as ``module``) and receives new weights exactly the way
vLLM does: :meth:`update_weights` takes ``(hf_name, full_tensor)`` pairs streamed by the hybrid-engine
sharding manager. So the HF and vLLM engines share one weight-handoff path and one set of tests.

Generation is a short sampling loop with a KV cache (no ``model.generate``): it gives us the raw logits of
every step, no hidden generation-config defaults (``top_k=50``, repetition penalties) and little overhead per
step, which matters for tiny models on CPU.

``rollout_log_probs`` -- which logprob is reported: ``log_softmax(logits / temperature)`` of the sampled token,
computed *before* top-k / top-p filtering. That is exactly what the trainer's ``compute_log_prob`` computes
(it divides the logits by ``meta_info["temperature"]`` and applies no filtering), so the two agree to float
rounding when the rollout has the actor's weights; the per-step metric ``training/rollout_probs_diff_*``
relies on this. For greedy decoding (temperature 0) the logprob is taken at temperature 1.

Vision-language models (Qwen2-VL): prompts carry their images in ``non_tensor_batch["multi_modal_data"]``
(``{"image": [PIL images]}`` per row, as vLLM takes them) and 3-row rotary positions (B, 3, T). The engine runs
the checkpoint's image processor on them (the same one the dataset used, so the image features equal the
trainer's) and continues all three position rows by one per generated token. Image and video placeholder tokens
are never sampled (:func:`never_sampled_token_ids`).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import torch
import torch.nn as nn

from verl.protocol import DataProto
from verl.utils.hf_experts import fused_expert_slot
from verl.utils.model import causal_lm_class, load_hf_config
from verl.utils.tokenizer import hf_processor
from verl.workers.config.rollout import as_rollout_config

from .async_server import TokenOutput
from .base import BaseRollout
from .utils import (eos_id_list, filter_logits_top_k_top_p, pad_right, resolve_special_tokens, resolve_torch_dtype,
                    response_mask_from_eos, sampling_params_for)

__all__ = ["HFRollout"]

logger = logging.getLogger(__name__)

# prefixes that wrappers (DDP/FSDP1, torch.compile, checkpoint wrappers) put in front of HF names
_WRAPPER_SEGMENTS = frozenset({"module", "_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"})


def never_sampled_token_ids(model_config) -> list[int]:
    """Image / video placeholder ids of a vision-language model: a response must not contain them (the training
    forward would take each one for a slot of image features that does not exist), so they are never sampled."""
    ids = [getattr(model_config, key, None) for key in ("image_token_id", "video_token_id")]
    return [int(i) for i in ids if i is not None]


def _strip_wrapper_prefixes(name: str) -> str:
    """Drop whole wrapper segments (DDP/FSDP/compile/checkpoint) from a dotted parameter name.

    Works on segments, not substrings: ``_fsdp_wrapped_module.x`` -> ``x``, ``my_module.w`` stays.
    """
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


class HFRollout(BaseRollout):
    """Sampling with a transformers causal LM.

    Args:
        config: the ``actor_rollout_ref.rollout`` config (``n``, ``temperature``, ``top_p``, ``top_k``, ``do_sample``,
            ``response_length``, ``val_kwargs``, ``dtype``, ``ignore_eos``; optional ``micro_batch_size``: rows
            generated at once, default all).
        model_path: an HF model directory to load the engine's own copy from.
        module: an already built (unsharded) ``nn.Module`` to use instead of ``model_path``. verl's old call
            order ``HFRollout(module, config)`` is accepted too.
        tokenizer / generation_config: where the default ``eos_token_id`` / ``pad_token_id`` come from when the
            prompts' ``meta_info`` does not carry them.
        processor: a vision-language model's processor for prompts with images (default: ``model_path``'s).
    """

    def __init__(self, config: Any = None, model_path: str | None = None, *, module: nn.Module | None = None,
                 tokenizer=None, generation_config=None, dtype: Any = None, trust_remote_code: bool = False,
                 device: str | torch.device = "cpu", processor=None, **_ignored):
        if isinstance(config, nn.Module):  # verl's HFRollout(module, config)
            module, config, model_path = config, model_path, None
        self.config = config = as_rollout_config(config)
        self.device = torch.device(device)
        self.dtype = resolve_torch_dtype(dtype if dtype is not None else config.dtype)
        if module is None:
            if model_path is None:
                raise ValueError("HFRollout needs model_path (an HF model directory) or module")
            hf_config = load_hf_config(model_path, trust_remote_code=trust_remote_code)
            module = causal_lm_class(hf_config).from_pretrained(model_path, dtype=self.dtype,
                                                                trust_remote_code=trust_remote_code)
        else:
            module = module.to(self.dtype)
        self.model_path = model_path
        self.trust_remote_code = trust_remote_code
        self._processor = processor  # else loaded from model_path when the first prompt with images arrives
        self.module = module.to(self.device).eval()
        self.module.requires_grad_(False)
        self._never_sample = never_sampled_token_ids(getattr(self.module, "config", None))

        self.eos_token_id, self.pad_token_id = resolve_special_tokens(generation_config, getattr(self.module, "generation_config", None), tokenizer,
                    getattr(self.module, "config", None))
        self.last_update_stats: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------ weights
    def _tied_output_embedding(self) -> bool:
        out = getattr(self.module, "get_output_embeddings", lambda: None)()
        inp = getattr(self.module, "get_input_embeddings", lambda: None)()
        return out is not None and inp is not None and out.weight is inp.weight

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors into the engine's model by HF name (dtype cast to the engine's dtype).

        A tied ``lm_head.weight`` (shared with the input embedding) is accepted and written into the shared
        tensor; per-expert checkpoint names (``experts.<e>.gate_proj.weight``, what the Megatron engine exports) go
        into the model's fused expert parameters. Unknown names raise KeyError: a silent partial update would leave
        the engine stale.
        """
        targets = dict(self.module.named_parameters())
        targets.update(dict(self.module.named_buffers()))
        tied = self._tied_output_embedding()
        unknown, count, nbytes = [], 0, 0
        for name, tensor in named_tensors:
            key = _strip_wrapper_prefixes(name)
            target = targets.get(key)
            if target is None and key == "lm_head.weight" and tied:
                target = self.module.get_output_embeddings().weight
            if target is None:
                target = fused_expert_slot(key, targets)
            if target is None:
                if key.endswith("rotary_emb.inv_freq"):
                    continue
                unknown.append(name)
                continue
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(f"update_weights: {name} has shape {tuple(tensor.shape)}, the rollout model expects "
                                 f"{tuple(target.shape)}")
            target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
            count += 1
            nbytes += tensor.numel() * tensor.element_size()
        if unknown:
            raise KeyError(f"update_weights: {len(unknown)} tensor names unknown to the rollout model "
                           f"(first: {unknown[:5]}); the training and rollout models must use the same HF names")
        self.last_update_stats = {"num_tensors": float(count), "num_bytes": float(nbytes)}

    # --------------------------------------------------------------------------------------- generation
    @torch.inference_mode()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        meta = dict(prompts.meta_info)
        params = sampling_params_for(self.config, meta)
        eos_ids = eos_id_list(meta.get("eos_token_id", self.eos_token_id))
        if self.config.ignore_eos:
            eos_ids = []
        pad_id = meta.get("pad_token_id", self.pad_token_id)
        pad_id = int(pad_id if pad_id is not None else 0)
        response_length = self.config.response_length

        idx = prompts.batch["input_ids"].to(self.device)
        attn = prompts.batch["attention_mask"].to(self.device)
        pos = prompts.batch["position_ids"].to(self.device) if "position_ids" in prompts.batch.keys() else (
            torch.clamp(torch.cumsum(attn, dim=-1) - 1, min=0))
        n = params["n"]
        images = self._row_images(prompts)
        if n > 1:
            idx, attn, pos = (t.repeat_interleave(n, dim=0) for t in (idx, attn, pos))
            images = [row for row in images for _ in range(n)] if images is not None else None

        micro = int(self.config.micro_batch_size or idx.size(0))
        responses, logps = [], []
        for start in range(0, idx.size(0), micro):
            sl = slice(start, start + micro)
            vision = self._vision_inputs(images[sl]) if images is not None else {}
            r, lp = self._sample(idx[sl], attn[sl], pos[sl], params, eos_ids, pad_id, response_length, vision)
            responses.append(pad_right(r, response_length, pad_id))
            logps.append(pad_right(lp, response_length, 0.0))
        responses = torch.cat(responses, dim=0)
        rollout_log_probs = torch.cat(logps, dim=0)

        response_mask = response_mask_from_eos(responses, eos_ids, dtype=attn.dtype)
        responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_id))
        rollout_log_probs = rollout_log_probs * response_mask.to(rollout_log_probs.dtype)
        delta = torch.arange(1, response_length + 1, device=pos.device, dtype=pos.dtype).unsqueeze(0)
        batch = {
            "prompts": idx,
            "responses": responses,
            "input_ids": torch.cat([idx, responses], dim=-1),
            "attention_mask": torch.cat([attn, response_mask], dim=-1),
            "position_ids": torch.cat([pos, pos[..., -1:] + delta], dim=-1),
            "rollout_log_probs": rollout_log_probs.float(),
        }
        meta.setdefault("eos_token_id", self.eos_token_id)
        meta.setdefault("pad_token_id", pad_id)
        return DataProto.from_dict(tensors={k: v.cpu() for k, v in batch.items()}, meta_info=meta)

    @torch.inference_mode()
    def generate_requests(self, requests: list) -> list:
        """Request-level generation: requests with the same sampling settings are left-padded into one sampling
        loop; each row keeps its own ``max_tokens`` and stops at its first EOS (see ``async_server``)."""
        eos_all = [] if self.config.ignore_eos else eos_id_list(self.eos_token_id)
        pad_id = int(self.pad_token_id if self.pad_token_id is not None else 0)
        groups: dict[tuple, list[int]] = {}
        for i, req in enumerate(requests):
            p = req.params
            key = (p["do_sample"], p["temperature"], p["top_p"], p["top_k"], p["ignore_eos"])
            groups.setdefault(key, []).append(i)
        results: list = [None] * len(requests)
        for key, members in groups.items():
            params = dict(do_sample=key[0], temperature=key[1], top_p=key[2], top_k=key[3])
            eos_ids = [] if key[4] else eos_all
            width = max(len(requests[i].prompt_ids) for i in members)
            idx = torch.full((len(members), width), pad_id, dtype=torch.long)
            attn = torch.zeros((len(members), width), dtype=torch.long)
            for row, i in enumerate(members):
                ids = requests[i].prompt_ids
                idx[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
                attn[row, width - len(ids):] = 1
            pos = torch.clamp(torch.cumsum(attn, dim=-1) - 1, min=0)
            max_new = max(requests[i].params["max_tokens"] for i in members)
            toks, lps = self._sample(idx.to(self.device), attn.to(self.device), pos.to(self.device), params,
                                     eos_ids, pad_id, max_new)
            for row, i in enumerate(members):
                limit = requests[i].params["max_tokens"]
                ids, logps = toks[row, :limit].tolist(), lps[row, :limit].float().tolist()
                stop = next((t for t, tok in enumerate(ids) if tok in eos_ids), None)
                if stop is not None:
                    ids, logps, reason = ids[: stop + 1], logps[: stop + 1], "stop"
                else:
                    reason = "length"
                results[i] = TokenOutput(token_ids=ids, log_probs=logps, finish_reason=reason,
                                         request_id=requests[i].request_id)
        return results

    # ---------------------------------------------------------------------------------------------- images
    @staticmethod
    def _row_images(prompts: DataProto) -> list[list] | None:
        """Each row's images (``multi_modal_data["image"]``), or None when no row has any."""
        data = prompts.non_tensor_batch.get("multi_modal_data")
        if data is None:
            return None
        rows = [list((d or {}).get("image") or []) if isinstance(d, dict) else [] for d in data]
        return rows if any(rows) else None

    def _vision_inputs(self, rows: list[list]) -> dict:
        """``pixel_values`` / ``image_grid_thw`` of the rows' images, in row order (the model's prefill inputs)."""
        flat = [img for row in rows for img in row]
        if not flat:
            return {}
        if self._processor is None:
            self._processor = hf_processor(self.model_path, trust_remote_code=self.trust_remote_code) \
                if self.model_path else None
            if self._processor is None:
                raise ValueError(f"prompts carry images (multi_modal_data) but the rollout model at {self.model_path} "
                                 "has no image processor; use a vision-language model directory")
        out = self._processor.image_processor(images=flat, return_tensors="pt")
        return {"pixel_values": out["pixel_values"].to(self.device, self.dtype),
                "image_grid_thw": out["image_grid_thw"].to(self.device)}

    @staticmethod
    def _positions(pos: torch.Tensor) -> torch.Tensor:
        """3-row rotary positions are stored (B, 3, T); the model takes (3, B, T)."""
        return pos.transpose(0, 1) if pos.dim() == 3 else pos

    def _sample(self, idx, attn, pos, params, eos_ids, pad_id, max_new_tokens, vision: dict | None = None):
        """Decode up to ``max_new_tokens`` tokens for one micro-batch; returns (tokens, logprobs) (B, T<=max).
        ``vision``: the prompts' image inputs for the prefill (vision-language models)."""
        greedy = not params["do_sample"]
        temperature = 1.0 if greedy else params["temperature"]
        bsz = idx.size(0)
        eos_t = torch.tensor(eos_ids, device=idx.device, dtype=idx.dtype) if eos_ids else None
        finished = torch.zeros(bsz, dtype=torch.bool, device=idx.device)
        tokens, logps = [], []
        out = self.module(input_ids=idx, attention_mask=attn, position_ids=self._positions(pos), use_cache=True,
                          **(vision or {}))
        past, logits = out.past_key_values, out.logits[:, -1, :]
        for step in range(max_new_tokens):
            scaled = logits.float() / temperature
            logp_all = torch.log_softmax(scaled, dim=-1)
            if self._never_sample:  # like top-k: changes what is sampled, not the reported log-prob
                scaled = scaled.index_fill(-1, torch.tensor(self._never_sample, device=scaled.device), float("-inf"))
            if greedy:
                tok = torch.argmax(scaled, dim=-1)
            else:
                filtered = filter_logits_top_k_top_p(scaled, params["top_k"], params["top_p"])
                tok = torch.multinomial(torch.softmax(filtered, dim=-1), num_samples=1).squeeze(-1)
            tok = torch.where(finished, torch.full_like(tok, pad_id), tok)
            lp = torch.gather(logp_all, -1, tok.unsqueeze(-1)).squeeze(-1).masked_fill(finished, 0.0)
            tokens.append(tok)
            logps.append(lp)
            if eos_t is not None:
                finished = finished | torch.isin(tok, eos_t)
            if bool(finished.all()) or step == max_new_tokens - 1:
                break
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=-1)
            pos = pos[..., -1:] + 1
            out = self.module(input_ids=tok.unsqueeze(-1), attention_mask=attn, position_ids=self._positions(pos),
                              past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :]
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1)

    # ------------------------------------------------------------------------------------------ memory
    def release_cache(self) -> None:
        """The KV cache lives only inside one ``generate_sequences`` call; nothing persists to free."""

    def resume(self, tags: tuple[str, ...] | None = None) -> None:
        """Nothing to wake up: the model copy stays resident."""
