"""A tiny vision-language model (Qwen2-VL architecture) built from a config, with its processor, offline.

Qwen2-VL is the VLM family that both transformers (training) and vLLM (rollout) implement: a ViT-style vision
tower cuts each image into 14x14 patches (two frames per temporal patch), merges 2x2 neighbouring patches into
one token and writes those tokens into the text model's embedding sequence where the prompt holds
``<|image_pad|>`` placeholders; positions are 3-D rotary (temporal, height, width) ids ("M-RoPE").

The directory written by :func:`make_vlm_model_dir` holds what a hub checkpoint holds:

- ``config.json`` + ``model.safetensors``: ``Qwen2VLForConditionalGeneration`` with random weights
  (2 text layers of width 128, 2 vision layers of width 64, ~0.6M parameters), fp32;
- the embedded byte-level tokenizer extended with the four vision tokens (ids 259-262) and a chat template
  that renders an ``{"type": "image"}`` content item as ``<|vision_start|><|image_pad|><|vision_end|>``;
- ``preprocessor_config.json``: a ``Qwen2VLImageProcessor`` whose min and max pixel counts are both
  ``IMAGE_SIZE**2``, so every image is resized to 56x56 = 4x4 patches = 4 image tokens.

    python -m verl.utils.embedded.vlm --out ~/models/vlm-tiny
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from verl.utils.embedded.dirs import write_new_dir
from verl.utils.embedded.tokenizer import (BOS_TOKEN_ID, EOS_TOKEN_ID, MODEL_MAX_LENGTH, PAD_TOKEN_ID, VOCAB_SIZE,
                                           load_tokenizer)

__all__ = ["VISION_TOKENS", "VLM_CHAT_TEMPLATE", "IMAGE_SIZE", "build_vlm_config", "build_vlm_model",
           "build_vlm_tokenizer", "build_image_processor", "make_vlm_model_dir"]

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID, VIDEO_PAD_ID = range(VOCAB_SIZE, VOCAB_SIZE + len(VISION_TOKENS))
VLM_VOCAB_SIZE = VOCAB_SIZE + len(VISION_TOKENS)  # 263

PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 14, 2, 2
IMAGE_SIZE = 56  # pixels per side after resizing: (56 / 14)^2 = 16 patches -> 16 / 2^2 = 4 image tokens

# Qwen's turn layout; content is a string or a list of {"type": "text"|"image"|"video", ...} items.
VLM_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for item in message['content'] %}"
    "{%- if item['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'video' %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' %}{{- item['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_vlm_tokenizer():
    """The embedded tokenizer plus the four vision tokens (ids 259..262, in ``VISION_TOKENS`` order)."""
    tok = load_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    ids = tok.convert_tokens_to_ids(list(VISION_TOKENS))
    if ids != [VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID, VIDEO_PAD_ID]:
        raise RuntimeError(f"vision tokens got ids {ids}; the embedded tokenizer's vocabulary changed")
    tok.chat_template = VLM_CHAT_TEMPLATE
    return tok


def build_image_processor(image_size: int = IMAGE_SIZE):
    """Qwen2-VL's image processor (PIL backend, no torchvision needed) resizing every image to about
    ``image_size`` x ``image_size`` pixels (a multiple of patch x merge = 28)."""
    if image_size % (PATCH_SIZE * MERGE_SIZE):
        raise ValueError(f"image_size must be a multiple of {PATCH_SIZE * MERGE_SIZE}, got {image_size}")
    pixels = image_size * image_size
    return Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels, patch_size=PATCH_SIZE,
                                    merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE)


def build_vlm_config(text_layers: int = 2, vision_layers: int = 2, hidden_size: int = 128):
    """A ``Qwen2VLConfig``: text heads of width 32 (vLLM's CPU attention needs >= 32), M-RoPE sections
    (4, 6, 6) over the 16 rotary frequency pairs, tied embeddings, vision tower of width 64 (2 heads)."""
    head_dim = 32
    text = dict(
        vocab_size=VLM_VOCAB_SIZE, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=text_layers, num_attention_heads=hidden_size // head_dim, num_key_value_heads=2,
        max_position_embeddings=MODEL_MAX_LENGTH, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
        bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID,
    )
    vision = dict(depth=vision_layers, embed_dim=64, hidden_size=hidden_size, num_heads=2, mlp_ratio=2,
                  patch_size=PATCH_SIZE, spatial_merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE)
    return Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE_PAD_ID,
                         video_token_id=VIDEO_PAD_ID, vision_start_token_id=VISION_START_ID,
                         vision_end_token_id=VISION_END_ID, tie_word_embeddings=True,
                         bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID)


def build_vlm_model(seed: int = 0, **config_kwargs):
    """A freshly initialised fp32 ``Qwen2VLForConditionalGeneration``; the global torch RNG is left untouched."""
    config = build_vlm_config(**config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config).float()
    model.generation_config = GenerationConfig(bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID,
                                               pad_token_id=PAD_TOKEN_ID)
    return model.eval()


def save_vlm_processor(out_dir: str, image_size: int = IMAGE_SIZE) -> None:
    """Write the tokenizer (with chat template) and the image processor files that ``hf_processor`` reads."""
    build_vlm_tokenizer().save_pretrained(out_dir)
    build_image_processor(image_size).save_pretrained(out_dir)
    # name the processor class the way hub checkpoints do, so loaders know which processor to assemble
    for name in ("preprocessor_config.json",):
        path = os.path.join(out_dir, name)
        with open(path) as f:
            cfg = json.load(f)
        cfg["processor_class"] = "Qwen2VLProcessor"
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
    with open(os.path.join(out_dir, "processor_config.json"), "w") as f:
        json.dump({"processor_class": "Qwen2VLProcessor"}, f, indent=2)
        f.write("\n")


def make_vlm_model_dir(out_dir: str, seed: int = 0, image_size: int = IMAGE_SIZE, **config_kwargs) -> str:
    """Write the tiny VLM as an HF directory at ``out_dir`` (written beside it, then renamed into place)."""
    def write(tmp_dir: str) -> None:
        build_vlm_model(seed, **config_kwargs).save_pretrained(tmp_dir, safe_serialization=True)
        save_vlm_processor(tmp_dir, image_size)

    return write_new_dir(out_dir, write)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory to write (must not exist or be empty)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument("--image_size", type=int, default=IMAGE_SIZE, help="pixels per side images are resized to")
    args = parser.parse_args(argv)
    try:
        path = make_vlm_model_dir(args.out, args.seed, args.image_size)
    except (FileExistsError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    print(path)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
