"""The embedded tokenizer: byte-level, no merges, three special tokens, a Qwen-style chat template.

Why this construction: transformers 5 loads any tokenizer that sits beside a ``qwen2`` config.json as
``Qwen2Tokenizer`` and swaps in Qwen2's own pre-tokenizer (a regex split followed by byte-level mapping).
A character-level ``WordLevel`` vocabulary does not survive that swap (spaces and newlines vanish).
A byte-level BPE whose vocabulary is exactly the 256 byte symbols and which has *no merges* gives the
same ids whichever pre-tokenizer runs in front of it, so the round trip is exact for any UTF-8 text,
whether it is loaded by ``load_tokenizer()``, ``AutoTokenizer.from_pretrained(model_dir)`` or vLLM.

Ids: 0..255 are the bytes themselves (the id of ``"7"`` is ``ord("7")``), then
``<|endoftext|>`` (pad), ``<|im_start|>`` and ``<|im_end|>`` (eos). There is no BOS token and the
tokenizer adds no special tokens on its own, like Qwen2.

The JSON files in ``assets/`` are produced by ``write_tokenizer_assets()``
(``python -m verl.utils.embedded.tokenizer``); a test checks that they still match this builder.
"""

from __future__ import annotations

import json
import os

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"  # starts every chat turn; never prepended automatically
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
NUM_BYTE_TOKENS = 256
VOCAB_SIZE = NUM_BYTE_TOKENS + len(SPECIAL_TOKENS)  # 259
PAD_TOKEN_ID, BOS_TOKEN_ID, EOS_TOKEN_ID = range(NUM_BYTE_TOKENS, VOCAB_SIZE)
MODEL_MAX_LENGTH = 2048

# Qwen's layout (`<|im_start|>role\n...<|im_end|>\n`) without a default system turn: prompts stay short,
# which matters for a 1M-parameter model.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def byte_symbols() -> list[str]:
    """The printable stand-in character for each byte 0..255, as byte-level BPE tokenizers use.

    Bytes that are visible Latin-1 characters stand for themselves; the others (control characters,
    space, 0x7f-0xa0, 0xad) are shifted to code points 256, 257, ... in byte order.
    """
    visible = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    symbols, shifted = [], 0
    for b in range(NUM_BYTE_TOKENS):
        if b in visible:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def build_tokenizer():
    """Build the tokenizer in memory (a ``PreTrainedTokenizerFast``); see the module docstring."""
    vocab = {sym: i for i, sym in enumerate(byte_symbols())}
    for offset, tok in enumerate(SPECIAL_TOKENS):
        vocab[tok] = NUM_BYTE_TOKENS + offset
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
    )


def save_tokenizer(out_dir: str) -> None:
    """Write the tokenizer files (tokenizer.json, tokenizer_config.json, chat_template.jinja) to out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    build_tokenizer().save_pretrained(out_dir)
    # Name the class users get beside a qwen2 config.json, so loading the bare assets gives the same class.
    cfg_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg.pop("backend", None)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def write_tokenizer_assets() -> str:
    """Regenerate the committed files in ``assets/``; returns the directory."""
    save_tokenizer(ASSETS_DIR)
    return ASSETS_DIR


def load_tokenizer():
    """The embedded tokenizer, loaded from the committed assets exactly as ``AutoTokenizer`` loads it."""
    if not os.path.exists(os.path.join(ASSETS_DIR, "tokenizer.json")):
        raise FileNotFoundError(
            f"embedded tokenizer files are missing from {ASSETS_DIR}; "
            "regenerate them with `python -m verl.utils.embedded.tokenizer`"
        )
    return AutoTokenizer.from_pretrained(ASSETS_DIR)


if __name__ == "__main__":
    print(f"wrote tokenizer assets to {write_tokenizer_assets()}")
