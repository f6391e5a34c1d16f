"""Rebuild an HF model from a Megatron engine checkpoint (``<local_dir>/dist_ckpt`` + ``<local_dir>/huggingface``).

One process: a gloo group of size 1 and a TP=1, PP=1 model grid; megatron's dist-checkpointing reshards the
saved tensors (whatever tensor / pipeline layout wrote them) into that model, and the HF<->mcore maps
(``verl.models.mcore``) rename them. A critic checkpoint (``--is-value-model``, or a token-classification
config) is written as ``*ForTokenClassification`` with its ``score`` head.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from transformers import AutoConfig

from verl.model_merger.base_model_merger import BaseModelMerger
from verl.models.mcore.convert import HFWeights
from verl.models.mcore.lora import apply_lora, load_lora_settings
from verl.models.mcore.model import build_gpt_model, iter_hf_params
from verl.single_controller.base.worker import get_free_port
from verl.utils.megatron.checkpoint import DIST_CKPT
from verl.utils.megatron.parallel import init_model_parallel

__all__ = ["MegatronModelMerger", "load_megatron_checkpoint"]


def _single_process_group() -> bool:
    """Start a one-process gloo group if none exists; returns whether this call started it."""
    if dist.is_initialized():
        return False
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(get_free_port("127.0.0.1")))
    dist.init_process_group("gloo", rank=0, world_size=1)
    return True


def load_megatron_checkpoint(local_dir: str, hf_config, value_head: bool) -> dict[str, torch.Tensor]:
    """Full HF state dict of a Megatron checkpoint folder (``.../global_step_N/actor`` or ``critic``)."""
    # optional heavy dependency: megatron-core (~10 s to import) is needed only for this backend
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    ckpt = os.path.join(local_dir, DIST_CKPT)
    if not os.path.isdir(ckpt):
        raise FileNotFoundError(f"{local_dir} has no {DIST_CKPT}/ folder: is it a checkpoint written with "
                                "strategy=megatron (e.g. .../global_step_N/actor)? For FSDP checkpoints use "
                                "--backend fsdp")
    started = _single_process_group()
    try:
        init_model_parallel(1, 1, seed=0, owner="model_merger")
        dtype = getattr(hf_config, "torch_dtype", None) or torch.float32
        dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype), torch.float32)
        model = build_gpt_model(hf_config, value_head=value_head, sequence_parallel=False, dtype=dtype)
        lora = load_lora_settings(local_dir)
        if lora is not None:  # a LoRA run: the adapters are read too and the weights come out merged
            apply_lora(model, hf_config, lora, seed=0)
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, ckpt)
        model.load_state_dict(loaded["model"], strict=False)
        return {k: v.clone() for k, v in iter_hf_params(model, hf_config, value_head)}
    finally:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if started:
            dist.destroy_process_group()


class MegatronModelMerger(BaseModelMerger):
    """``merge``: write the HF model to ``--target_dir``; ``test``: compare with ``--test_hf_dir``."""

    def _state(self) -> dict[str, torch.Tensor]:
        config = AutoConfig.from_pretrained(self.hf_config_dir, trust_remote_code=self.config.trust_remote_code)
        archs = getattr(config, "architectures", None) or []
        value_head = self.config.is_value_model or any(a.endswith("ForTokenClassification") for a in archs)
        if value_head and archs:
            config.architectures = [a.replace("ForTokenClassification", "ForCausalLM") for a in archs]
        self._value_head = value_head
        return load_megatron_checkpoint(self.local_dir, config, value_head)

    def merge_and_save(self) -> str:
        state = self._state()
        out = self.save_hf_model(state, self.config.target_dir or "tmp")
        if self._value_head:
            config = AutoConfig.from_pretrained(out, trust_remote_code=self.config.trust_remote_code)
            config.architectures = [a.replace("ForCausalLM", "ForTokenClassification")
                                    for a in (config.architectures or [])]
            config.num_labels = 1
            config.save_pretrained(out)
        print(f"wrote {out}")
        return out

    def test(self) -> None:
        """Every merged tensor equals the one of the same name in ``--test_hf_dir`` (rtol/atol 1e-5)."""
        reference = HFWeights(self.config.test_hf_dir)
        for name, tensor in self._state().items():
            if name not in reference:
                if name == "lm_head.weight":
                    continue  # tied embeddings: the reference stores only the embedding
                raise ValueError(f"{self.config.test_hf_dir} has no tensor {name!r}")
            ref = reference.get(name)
            if ref.shape != tensor.shape or not torch.allclose(ref.to(tensor.dtype), tensor, rtol=1e-5, atol=1e-5):
                raise ValueError(f"{name} differs from {self.config.test_hf_dir}")
        print("merged weights match", self.config.test_hf_dir)
