"""Loading Hugging Face configs and models from local directories.

Three model kinds are built here, all from a local HF directory (no hub access):

- the policy: ``AutoModelForCausalLM`` (:func:`load_causal_lm`);
- the critic: ``AutoModelForTokenClassification`` with ``num_labels=1`` (:func:`load_value_model`). The critic
  usually starts from the actor's checkpoint, a causal LM: its body weights load into the token-classification
  body, the language-model head is dropped, and the value head (``score``), absent from the checkpoint, starts
  at zero so every initial value is 0 instead of noise;
- reward models: ``AutoModelForSequenceClassification`` (:func:`load_reward_model`).

``override_config`` (verl's ``model.override_config``) is a dict of config attributes applied before the model
is built, nested dicts update nested configs.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    GenerationConfig,
)
from transformers.utils import logging as hf_logging

from verl.utils.torch_dtypes import to_torch_dtype  # the one dtype resolver (also importable from here)


def check_model_dir(path: str) -> str:
    """Expand ``path`` and check it is a local Hugging Face model directory; return the expanded path."""
    if path is None:
        raise ValueError("model path is None: set model.path to a local Hugging Face model directory")
    expanded = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isdir(expanded):
        raise FileNotFoundError(
            f"model directory {path!r} does not exist (looked at {expanded}); model.path must be a local Hugging Face "
            "model directory (config.json + weights). No model hub is used: copy or convert the model there first."
        )
    if not os.path.isfile(os.path.join(expanded, "config.json")):
        raise FileNotFoundError(
            f"{expanded} is not a Hugging Face model directory: it has no config.json. Point model.path at the folder "
            "written by save_pretrained (config.json, *.safetensors, tokenizer files)."
        )
    return expanded


def update_model_config(module_config, override_config_kwargs: dict[str, Any] | None):
    """Apply ``override_config`` (nested dicts update nested sub-configs) to an HF config in place."""
    if not override_config_kwargs:
        return module_config
    for key, val in dict(override_config_kwargs).items():
        if hasattr(val, "items") and hasattr(module_config, key) and not isinstance(getattr(module_config, key), dict):
            update_model_config(getattr(module_config, key), val)
        else:
            setattr(module_config, key, val)
    return module_config


def _plain(obj):
    """OmegaConf containers -> plain python."""
    if isinstance(obj, (DictConfig, ListConfig)):
        return OmegaConf.to_container(obj, resolve=True)
    return obj


def load_hf_config(path: str, override_config: dict | None = None, trust_remote_code: bool = False):
    """AutoConfig from a local dir, with ``override_config`` applied."""
    path = check_model_dir(path)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    update_model_config(config, _plain(override_config))
    return config


def get_generation_config(path: str, trust_remote_code: bool = False):
    """The model's GenerationConfig, or one derived from its config, or None."""
    path = check_model_dir(path)
    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:
        try:
            return GenerationConfig.from_model_config(load_hf_config(path, trust_remote_code=trust_remote_code))
        except Exception:
            return None


def _from_pretrained(auto_cls, path, config, dtype, trust_remote_code, attn_implementation):
    kwargs = dict(config=config, dtype=dtype, trust_remote_code=trust_remote_code, output_loading_info=True)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model, info = auto_cls.from_pretrained(path, **kwargs)
    except ValueError as err:
        if "Unrecognized configuration class" in str(err):
            raise ValueError(
                f"{auto_cls.__name__} has no class for model_type={config.model_type!r} (model at {path}): "
                "use a model type transformers supports for this head, or set trust_remote_code=True for custom code"
            ) from err
        raise
    return model, info


@contextlib.contextmanager
def _hf_errors_only():
    """Show only errors from transformers' logging inside the block (e.g. an expected missing-keys report)."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def _load(auto_cls, path, dtype, override_config, trust_remote_code, attn_implementation, *,
          scalar_head: bool = False, quiet_load_report: bool = False):
    """The body shared by the three loaders: check the dir, build the config (``override_config`` applied; a
    ``scalar_head`` gets ``num_labels=1`` and no classifier dropout), then ``auto_cls.from_pretrained``.

    ``quiet_load_report`` hides transformers' missing/unexpected-keys report for this load only.
    Returns ``(model, loading_info)``.
    """
    path = check_model_dir(path)
    config = load_hf_config(path, override_config, trust_remote_code)
    if scalar_head:
        config.num_labels = 1
        config.classifier_dropout = 0.0
    with _hf_errors_only() if quiet_load_report else contextlib.nullcontext():
        return _from_pretrained(auto_cls, path, config, to_torch_dtype(dtype), trust_remote_code, attn_implementation)


def load_causal_lm(
    path: str,
    dtype: str | torch.dtype = torch.float32,
    override_config: dict | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = "sdpa",
) -> nn.Module:
    """``AutoModelForCausalLM`` from a local dir, parameters in ``dtype``; vision-language models (Qwen2-VL, ...),
    which transformers registers only as image-text-to-text models, load with ``AutoModelForImageTextToText``."""
    auto_cls = causal_lm_class(load_hf_config(path, override_config, trust_remote_code))
    model, _ = _load(auto_cls, path, dtype, override_config, trust_remote_code, attn_implementation)
    return model


def causal_lm_class(config):
    """The auto class that builds a language-model head for ``config`` (see :func:`load_causal_lm`)."""
    if (type(config) not in AutoModelForCausalLM._model_mapping
            and type(config) in AutoModelForImageTextToText._model_mapping):
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def _value_head(model: nn.Module) -> nn.Module | None:
    for name in ("score", "classifier", "v_head", "value_head"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Module):
            return head
    return None


def load_value_model(
    path: str,
    dtype: str | torch.dtype = torch.float32,
    override_config: dict | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = "sdpa",
) -> nn.Module:
    """Critic: ``AutoModelForTokenClassification`` (num_labels=1, no dropout) from a causal-LM or critic dir.

    When the directory holds a causal LM (the usual case: the critic starts from the actor's weights) the value
    head is missing from the checkpoint; it is then zero-initialised (weights and bias), so the critic starts by
    predicting 0 everywhere. A directory saved from a critic keeps its trained head.
    """
    # the "value head MISSING" load report is expected here: handled below
    model, info = _load(AutoModelForTokenClassification, path, dtype, override_config, trust_remote_code,
                        attn_implementation, scalar_head=True, quiet_load_report=True)
    head = _value_head(model)
    missing = set(info.get("missing_keys", []) or [])
    if head is not None and any(k.split(".")[0] in ("score", "classifier", "v_head", "value_head") for k in missing):
        with torch.no_grad():
            for p in head.parameters():
                p.zero_()
    return model


def load_reward_model(
    path: str,
    dtype: str | torch.dtype = torch.float32,
    override_config: dict | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = "sdpa",
) -> nn.Module:
    """Reward model: ``AutoModelForSequenceClassification`` with ``num_labels=1`` (score per sequence)."""
    model, _ = _load(AutoModelForSequenceClassification, path, dtype, override_config, trust_remote_code,
                     attn_implementation, scalar_head=True)
    return model


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids for a (left- or right-) padded batch: 0..L-1 over the valid tokens, 0 on left padding."""
    return torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0, max=None)


def get_model_size(model: nn.Module, scale: str = "auto") -> tuple[float, str]:
    n = sum(p.numel() for p in model.parameters())
    if scale == "auto":
        scale = "B" if n > 1e9 else "M" if n > 1e6 else "K" if n > 1e3 else ""
    div = {"B": 1e9, "M": 1e6, "K": 1e3, "": 1}[scale]
    return n / div, scale


def print_model_size(model: nn.Module, name: str | None = None) -> None:
    n, scale = get_model_size(model)
    print(f"{name or model.__class__.__name__} contains {n:.2f}{scale} parameters")


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model")  # Qwen2/2.5/3-VL; LLaVA, Gemma 3; Idefics, Mllama


def vision_tower(model: nn.Module) -> nn.Module | None:
    """The vision encoder of a vision-language model (``model.visual`` or ``model.model.visual`` and the other
    names in ``VISION_TOWER_NAMES``), or None for a text-only model."""
    base = unwrap_peft(model)
    for holder in (base, getattr(base, "model", None)):
        for name in VISION_TOWER_NAMES:
            found = getattr(holder, name, None) if holder is not None else None
            if isinstance(found, nn.Module):
                return found
    return None


def freeze_vision_tower(model: nn.Module, key: str = "actor.freeze_vision_tower") -> int:
    """``actor.freeze_vision_tower=True``: the vision encoder gets no gradients (and so no optimizer updates); the
    language model (or its LoRA adapters) still trains. Returns the number of frozen parameter tensors."""
    tower = vision_tower(model)
    if tower is None:
        raise ValueError(f"{key}=True, but the model has no vision tower (looked for "
                         f"{', '.join(VISION_TOWER_NAMES)}); set it to false for a text-only model")
    params = list(tower.parameters())
    for p in params:
        p.requires_grad_(False)
    return len(params)
