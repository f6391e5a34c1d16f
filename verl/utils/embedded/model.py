"""Small Qwen2 models built from a config (no hub), and a writer for a complete HF model directory.

The directory written by ``make_model_dir`` holds config.json, model.safetensors, generation_config.json and the
embedded tokenizer files; ``AutoModelForCausalLM``, ``AutoTokenizer`` and vLLM load it like any HF checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from verl.utils.embedded.tokenizer import (
    BOS_TOKEN_ID,
    EOS_TOKEN_ID,
    MODEL_MAX_LENGTH,
    PAD_TOKEN_ID,
    VOCAB_SIZE,
    save_tokenizer,
)

# Shapes per size; the comment is the parameter count with tied embeddings and the 259-token vocabulary.
MODEL_SIZES: dict[str, dict[str, int]] = {
    # ~1.02M
    "tiny": dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
    ),
    # ~25.4M
    "small": dict(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4
    ),
    # ~104M
    "base": dict(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4
    ),
}

MARKER_FILE = "embedded_model.json"  # records how the directory was made, so a second call can reuse it


def _check_size(size: str) -> dict[str, int]:
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown embedded model size {size!r}; choose one of {sorted(MODEL_SIZES)}")
    return MODEL_SIZES[size]


def build_config(size: str = "tiny"):
    """The ``Qwen2Config`` for one of ``MODEL_SIZES`` (vocabulary = the embedded tokenizer's 259 tokens)."""
    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MODEL_MAX_LENGTH,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
        use_sliding_window=False,
        **_check_size(size),
    )


def build_model(size: str = "tiny", seed: int = 0):
    """A freshly initialised fp32 ``Qwen2ForCausalLM`` of the given size; same seed, same weights.

    The global torch RNG is left untouched.
    """
    config = build_config(size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=PAD_TOKEN_ID
    )
    return model.eval()


def _existing_matches(out_dir: str, marker: dict) -> bool:
    path = os.path.join(out_dir, MARKER_FILE)
    if not os.path.exists(path):
        return False
    with open(path) as f:
        return json.load(f) == marker


def make_model_dir(out_dir: str, size: str = "tiny", seed: int = 0, overwrite: bool = False) -> str:
    """Write an HF model directory (model, tokenizer, generation config) to ``out_dir`` and return its path.

    The files are written to a temporary sibling directory that is renamed into place at the end, so a reader
    never sees a half-written model. If ``out_dir`` already holds the same size and seed it is reused as is;
    a different model there is an error unless ``overwrite=True``.
    """
    _check_size(size)
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    marker = {"size": size, "seed": int(seed)}
    if os.path.exists(out_dir):
        if not overwrite and _existing_matches(out_dir, marker):
            return out_dir
        if not overwrite and os.listdir(out_dir):
            raise FileExistsError(
                f"{out_dir} already exists and does not hold the embedded {size!r} model with seed {seed}; "
                "pass overwrite=True (CLI: --overwrite) or choose another directory"
            )
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        model = build_model(size, seed)
        model.save_pretrained(tmp_dir, safe_serialization=True)
        save_tokenizer(tmp_dir)
        with open(os.path.join(tmp_dir, MARKER_FILE), "w") as f:
            json.dump(marker, f)
        _make_readable(tmp_dir)
        if os.path.exists(out_dir):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=parent)
            os.rename(out_dir, os.path.join(old, "model"))
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp_dir, out_dir)
        except OSError:
            # Another process finished the same directory first: accept it if it is the same model.
            if _existing_matches(out_dir, marker):
                return out_dir
            raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir


def _make_readable(directory: str) -> None:
    """mkdtemp makes a 0700 directory: give it (and its files) the usual permissions under the umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for name in os.listdir(directory):
        os.chmod(os.path.join(directory, name), 0o666 & ~umask)


def count_parameters(model) -> int:
    """Number of distinct parameters (tied embedding counted once)."""
    return sum(p.numel() for p in model.parameters())
