"""What the quickstart needs on a machine without a model hub: a byte-level tokenizer committed as JSON,
small Qwen2 models built from a config, and an integer-arithmetic task in verl's parquet schema.

    from verl.utils.embedded import load_tokenizer, make_model_dir
    tok = load_tokenizer()
    path = make_model_dir("~/models/arith-tiny", size="tiny")   # config.json + model.safetensors + tokenizer

Names are imported lazily so that ``python -m verl.utils.embedded.<module>`` runs cleanly.
"""

import importlib

_EXPORTS = {
    "MODEL_SIZES": "model",
    "build_config": "model",
    "build_model": "model",
    "count_parameters": "model",
    "make_model_dir": "model",
    "CHAT_TEMPLATE": "tokenizer",
    "EOS_TOKEN": "tokenizer",
    "EOS_TOKEN_ID": "tokenizer",
    "PAD_TOKEN": "tokenizer",
    "PAD_TOKEN_ID": "tokenizer",
    "VOCAB_SIZE": "tokenizer",
    "build_tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
