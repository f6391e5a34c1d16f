"""Command line and shared steps of the model mergers (writing an HF directory from a full state dict)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass

import torch

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass
class ModelMergerConfig:
    operation: str  # "merge" | "test"
    backend: str
    local_dir: str
    target_dir: str | None = None
    hf_model_config_path: str | None = None
    test_hf_dir: str | None = None
    tie_word_embedding: bool = False
    is_value_model: bool = False
    trust_remote_code: bool = False
    max_shard_size_gb: float = 5.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m verl.model_merger",
                                     description="Merge a sharded verl checkpoint into a Hugging Face model.")
    sub = parser.add_subparsers(dest="operation", required=True)
    for name, help_text in (("merge", "write an HF model directory"), ("test", "compare with an HF model")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--backend", choices=["fsdp", "megatron"], required=True)
        p.add_argument("--local_dir", required=True, help="checkpoint folder, e.g. .../global_step_10/actor")
        p.add_argument("--hf_model_path", default=None, help="HF config dir (default: <local_dir>/huggingface)")
        p.add_argument("--tie-word-embedding", action="store_true", help="kept for verl compatibility")
        p.add_argument("--is-value-model", action="store_true", help="kept for verl compatibility")
        p.add_argument("--trust-remote-code", action="store_true")
        if name == "merge":
            p.add_argument("--target_dir", default="tmp", help="where to write the HF model")
            p.add_argument("--hf_upload_path", default=None, help="not supported (no hub access)")
            p.add_argument("--max_shard_size_gb", type=float, default=5.0)
        else:
            p.add_argument("--test_hf_dir", required=True, help="HF model dir to compare the merged weights with")
    return parser.parse_args(argv)


def generate_config_from_args(args: argparse.Namespace) -> ModelMergerConfig:
    if getattr(args, "hf_upload_path", None):
        raise SystemExit("--hf_upload_path is not supported: this machine has no model hub; upload the target_dir yourself")
    return ModelMergerConfig(
        operation=args.operation, backend=args.backend, local_dir=args.local_dir,
        target_dir=getattr(args, "target_dir", None), hf_model_config_path=args.hf_model_path,
        test_hf_dir=getattr(args, "test_hf_dir", None), tie_word_embedding=args.tie_word_embedding,
        is_value_model=args.is_value_model, trust_remote_code=args.trust_remote_code,
        max_shard_size_gb=getattr(args, "max_shard_size_gb", 5.0),
    )


class BaseModelMerger:
    def __init__(self, config: ModelMergerConfig):
        self.config = config
        local = os.path.abspath(os.path.expanduser(config.local_dir))
        if not os.path.isdir(local):
            raise FileNotFoundError(f"--local_dir {config.local_dir} does not exist; pass a checkpoint folder such "
                                    "as <default_local_dir>/global_step_N/actor")
        self.local_dir = local
        self.hf_config_dir = config.hf_model_config_path or os.path.join(local, "huggingface")
        if not os.path.isfile(os.path.join(self.hf_config_dir, "config.json")):
            raise FileNotFoundError(f"no config.json in {self.hf_config_dir}: the checkpoint's huggingface/ folder is "
                                    "missing; pass --hf_model_path <dir with the model's config.json>")

    def merge_and_save(self) -> str:
        raise NotImplementedError

    def test(self) -> None:
        raise NotImplementedError

    def save_hf_model(self, state_dict: dict[str, torch.Tensor], target_dir: str) -> str:
        """config + tokenizer files from the HF config dir, weights as (sharded) safetensors."""
        from safetensors.torch import save_file
        from transformers import AutoConfig

        target_dir = os.path.abspath(os.path.expanduser(target_dir))
        os.makedirs(target_dir, exist_ok=True)
        for name in os.listdir(self.hf_config_dir):  # config, generation config, tokenizer files
            src = os.path.join(self.hf_config_dir, name)
            if os.path.isfile(src) and not name.endswith(WEIGHT_SUFFIXES) and not name.endswith(".index.json"):
                shutil.copy2(src, os.path.join(target_dir, name))
        config = AutoConfig.from_pretrained(self.hf_config_dir, trust_remote_code=self.config.trust_remote_code)
        if getattr(config, "tie_word_embeddings", False) or self.config.tie_word_embedding:
            state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}

        limit = int(self.config.max_shard_size_gb * 1024**3)
        shards, current, size = [], {}, 0
        for k, v in state_dict.items():
            nbytes = v.numel() * v.element_size()
            if current and size + nbytes > limit:
                shards.append(current)
                current, size = {}, 0
            current[k] = v
            size += nbytes
        shards.append(current)
        if len(shards) == 1:
            save_file(shards[0], os.path.join(target_dir, "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, os.path.join(target_dir, fname), metadata={"format": "pt"})
                weight_map.update({k: fname for k in shard})
            total = sum(v.numel() * v.element_size() for v in state_dict.values())
            with open(os.path.join(target_dir, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        return target_dir
