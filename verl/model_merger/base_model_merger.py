"""Command line and shared steps of the model mergers (writing an HF directory from a full state dict)."""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import dataclass

import torch
from huggingface_hub import HfApi, constants, save_torch_state_dict
from transformers import AutoConfig, GenerationConfig

from verl.utils.checkpoint.fsdp_layout import own_storage

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
    max_shard_size: str | int = "5GB"
    hf_upload_path: str | None = None
    private: bool = False


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
            p.add_argument("--hf_upload_path", default=None,
                           help="also upload the merged model to this Hugging Face Hub repo (needs network and a token)")
            p.add_argument("--private", action="store_true", help="create the --hf_upload_path repo as private")
            p.add_argument("--max_shard_size", default="5GB",
                           help="largest safetensors file, e.g. 5GB or 500MB (bigger models are split, with an index)")
            p.add_argument("--max_shard_size_gb", type=float, default=None, help="the same limit in GiB (a number)")
        else:
            p.add_argument("--test_hf_dir", required=True, help="HF model dir to compare the merged weights with")
    return parser.parse_args(argv)


def generate_config_from_args(args: argparse.Namespace) -> ModelMergerConfig:
    upload = getattr(args, "hf_upload_path", None)
    if upload and constants.HF_HUB_OFFLINE:
        raise SystemExit(f"--hf_upload_path {upload}: the Hugging Face Hub is switched off here (HF_HUB_OFFLINE=1); "
                         "merge without it and upload --target_dir later (huggingface-cli upload), or unset "
                         "HF_HUB_OFFLINE on a machine with network access")
    shard = getattr(args, "max_shard_size", "5GB")
    if getattr(args, "max_shard_size_gb", None) is not None:
        shard = int(args.max_shard_size_gb * 1024**3)
    return ModelMergerConfig(
        operation=args.operation, backend=args.backend, local_dir=args.local_dir,
        target_dir=getattr(args, "target_dir", None), hf_model_config_path=args.hf_model_path,
        test_hf_dir=getattr(args, "test_hf_dir", None), tie_word_embedding=args.tie_word_embedding,
        is_value_model=args.is_value_model, trust_remote_code=args.trust_remote_code,
        max_shard_size=shard, hf_upload_path=upload, private=bool(getattr(args, "private", False)),
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
        """config, generation config and tokenizer files from the HF config dir; weights as safetensors split at
        ``max_shard_size`` (``model.safetensors.index.json`` when there are several files)."""
        target_dir = os.path.abspath(os.path.expanduser(target_dir))
        os.makedirs(target_dir, exist_ok=True)
        for name in os.listdir(target_dir):  # weights of an earlier merge would mix with these
            if name.endswith(WEIGHT_SUFFIXES) or name.endswith(".index.json"):
                os.remove(os.path.join(target_dir, name))
        for name in os.listdir(self.hf_config_dir):  # config, generation config, tokenizer files
            src = os.path.join(self.hf_config_dir, name)
            if os.path.isfile(src) and not name.endswith(WEIGHT_SUFFIXES) and not name.endswith(".index.json"):
                shutil.copy2(src, os.path.join(target_dir, name))
        config = AutoConfig.from_pretrained(self.hf_config_dir, trust_remote_code=self.config.trust_remote_code)
        if not os.path.exists(os.path.join(target_dir, "generation_config.json")):
            GenerationConfig.from_model_config(config).save_pretrained(target_dir)
        if getattr(config, "tie_word_embeddings", False) or self.config.tie_word_embedding:
            state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
        save_torch_state_dict(own_storage(state_dict), target_dir, max_shard_size=self.config.max_shard_size,
                              metadata={"format": "pt"})
        return target_dir

    def upload(self, target_dir: str) -> None:
        """Push ``target_dir`` to ``--hf_upload_path`` (creates the repo; ``--private`` makes it private)."""
        repo = self.config.hf_upload_path
        if not repo:
            return
        api = HfApi()
        api.create_repo(repo_id=repo, private=self.config.private, exist_ok=True)
        api.upload_folder(folder_path=target_dir, repo_id=repo, repo_type="model")
        print(f"uploaded {target_dir} to https://huggingface.co/{repo}")
