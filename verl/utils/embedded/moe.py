"""A tiny mixture-of-experts model (Qwen3-MoE architecture) built from a config, with the embedded tokenizer.

Qwen3-MoE is the MoE architecture that both transformers (FSDP training) and vLLM (rollout) run here: every
decoder layer routes each token to ``num_experts_per_tok`` of ``num_experts`` small MLPs through a learned gate.

    python -m verl.utils.embedded.moe --out ~/models/moe-tiny      # config.json + model.safetensors + tokenizer
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

from verl.utils.embedded.dirs import write_new_dir
from verl.utils.embedded.tokenizer import (BOS_TOKEN_ID, EOS_TOKEN_ID, MODEL_MAX_LENGTH, PAD_TOKEN_ID, VOCAB_SIZE,
                                           save_tokenizer)

__all__ = ["build_moe_config", "build_moe_model", "make_moe_model_dir"]


def build_moe_config(num_experts: int = 4, num_experts_per_tok: int = 2, num_hidden_layers: int = 2,
                     hidden_size: int = 64):
    """A ``Qwen3MoeConfig``: 4 heads / 2 kv heads of width 32 (vLLM's CPU attention needs >= 32), every layer
    sparse, top-k routing weights renormalised."""
    return Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        moe_intermediate_size=hidden_size // 2, num_experts=num_experts, num_experts_per_tok=num_experts_per_tok,
        num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        max_position_embeddings=MODEL_MAX_LENGTH, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID,
    )


def build_moe_model(seed: int = 0, **config_kwargs):
    """A freshly initialised fp32 ``Qwen3MoeForCausalLM``; the global torch RNG is left untouched."""
    config = build_moe_config(**config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(config).float()
    model.generation_config = GenerationConfig(bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID,
                                               pad_token_id=PAD_TOKEN_ID)
    return model.eval()


def make_moe_model_dir(out_dir: str, seed: int = 0, **config_kwargs) -> str:
    """Write the tiny MoE model as an HF directory at ``out_dir`` (written beside it, then renamed into place).

    The checkpoint holds one tensor per expert (``mlp.experts.<i>.{gate,up,down}_proj.weight``), the layout
    vLLM and older transformers read.
    """
    def write(tmp_dir: str) -> None:
        build_moe_model(seed, **config_kwargs).save_pretrained(tmp_dir, safe_serialization=True)
        save_tokenizer(tmp_dir)

    return write_new_dir(out_dir, write)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory to write (must not exist or be empty)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_experts", type=int, default=4)
    parser.add_argument("--num_experts_per_tok", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        path = make_moe_model_dir(args.out, args.seed, num_experts=args.num_experts,
                                  num_experts_per_tok=args.num_experts_per_tok)
    except (FileExistsError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    print(path)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
