"""Load a model directory's tokenizer and, for vision-language models, its multimodal processor (verl's helpers).

``hf_processor(path)`` returns a processor only for the VLM families the trainer knows how to feed
(``SUPPORTED_PROCESSORS``), else ``None``: text-only models train with the tokenizer alone.

Without torchvision, transformers cannot build any processor that has a video processor (Qwen2-VL's
constructor insists on one, and every video processor is torchvision-based). Images need none, so the processor
is then assembled from the directory's tokenizer and (PIL-backed) image processor with ``video_processor=None``;
it handles images exactly as the full processor does and refuses videos.
"""

from __future__ import annotations

import json
import logging
import os

import transformers
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

logger = logging.getLogger(__name__)

__all__ = ["hf_tokenizer", "hf_processor", "SUPPORTED_PROCESSORS", "set_pad_token_id"]

SUPPORTED_PROCESSORS = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor", "Glm4vImageProcessor",
                        "Glm4vProcessor")


def set_pad_token_id(tokenizer) -> None:
    """Use the EOS token for padding when the tokenizer has no pad token (verl's convention)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning("tokenizer has no pad token; using its eos token %r for padding", tokenizer.eos_token)


def hf_tokenizer(name_or_path: str, correct_pad_token: bool = True, **kwargs):
    """``AutoTokenizer.from_pretrained`` (a local directory), with a pad token guaranteed."""
    tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(str(name_or_path)), **kwargs)
    if correct_pad_token:
        set_pad_token_id(tokenizer)
    return tokenizer


def _declared_processor_class(path: str) -> str | None:
    """The processor class a checkpoint names (processor_config.json, then preprocessor_config.json)."""
    for name in ("processor_config.json", "preprocessor_config.json"):
        file = os.path.join(path, name)
        if os.path.isfile(file):
            with open(file) as f:
                cls = json.load(f).get("processor_class")
            if cls:
                return cls
    return None


def _image_only_processor(path: str, class_name: str, **kwargs):
    """The processor built from its tokenizer and image processor, with no video processor (see module doc)."""
    cls = getattr(transformers, class_name)

    class _WithoutVideo(cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    kwargs.pop("use_fast", None)
    tokenizer = hf_tokenizer(path, **kwargs)
    image_processor = AutoImageProcessor.from_pretrained(path, **kwargs)
    processor = _WithoutVideo(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                              chat_template=getattr(tokenizer, "chat_template", None))
    processor.__class__ = cls  # a plain instance of the real class (pickles by reference, isinstance holds)
    return processor


def hf_processor(name_or_path: str, **kwargs):
    """The multimodal processor of a supported VLM checkpoint, else None (text-only models, plain tokenizers)."""
    path = os.path.expanduser(str(name_or_path))
    declared = _declared_processor_class(path) if os.path.isdir(path) else None
    try:
        processor = AutoProcessor.from_pretrained(path, **kwargs)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds here; decided below
        if declared in SUPPORTED_PROCESSORS and not transformers.utils.is_torchvision_available():
            return _image_only_processor(path, declared, **kwargs)
        if declared in SUPPORTED_PROCESSORS:
            raise ValueError(f"cannot load the {declared} processor of the model at {path}: {err}") from err
        logger.info("no multimodal processor for %s (%s); using the tokenizer only", path, err)
        return None
    if type(processor).__name__ not in SUPPORTED_PROCESSORS:
        return None
    set_pad_token_id(processor.tokenizer)
    return processor
