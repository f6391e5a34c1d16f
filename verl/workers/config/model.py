"""verl's ``HFModelConfig``, built on the schema's ``actor_rollout_ref.model`` section.

The keys are the yaml's; what verl derives from them (local paths, the tokenizer, the processor, the HF config with
``override_config`` applied, the generation config, the architectures) are read-only attributes computed on first
read, so building the config (in the driver) loads nothing and a worker loads the tokenizer once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from verl.trainer.config_schema.actor import ModelConfig
from verl.trainer.config_schema.spec import key
from verl.utils.fs import copy_to_local
from verl.utils.import_utils import import_external_libs
from verl.workers.config.base import CheckedSection

__all__ = ["HFModelConfig"]

HERE = "verl/workers/config/model.py"


@dataclass(frozen=True)
class HFModelConfig(ModelConfig, CheckedSection):
    """``actor_rollout_ref.model``: the policy checkpoint, its tokenizer and how it is adapted."""

    load_tokenizer: bool = key(True, "load the tokenizer and processor (false: only the model config is read)",
                               read_in=(HERE,))

    # ------------------------------------------------------------------ derived, computed on first read
    @property
    def local_path(self) -> str:
        return copy_to_local(self.path, use_shm=self.use_shm)

    @property
    def local_hf_config_path(self) -> str:
        return copy_to_local(self.hf_config_path or self.path, use_shm=self.use_shm)

    @property
    def local_tokenizer_path(self) -> str:
        return copy_to_local(self.tokenizer_path or self.path, use_shm=self.use_shm)

    @functools.cached_property
    def tokenizer(self) -> Any:
        if not self.load_tokenizer:
            return None
        import_external_libs(self.external_lib)
        # optional heavy dependency: transformers loads when a worker first reads the tokenizer
        from verl.utils.tokenizer import hf_tokenizer

        return hf_tokenizer(self.local_tokenizer_path, trust_remote_code=self.trust_remote_code)

    @functools.cached_property
    def processor(self) -> Any:
        if not self.load_tokenizer:
            return None
        # optional heavy dependency: transformers loads when a worker first reads the processor
        from verl.utils.tokenizer import hf_processor

        return hf_processor(self.local_tokenizer_path, trust_remote_code=self.trust_remote_code)

    @functools.cached_property
    def hf_config(self) -> Any:
        """The model's HF config with ``override_config`` and the tokenizer's special token ids applied."""
        import_external_libs(self.external_lib)
        # optional heavy dependency: transformers loads when a worker first reads the HF config
        from verl.utils.model import load_hf_config

        overrides = dict(self.override_config)
        tokenizer = self.tokenizer
        if tokenizer is not None:
            ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                   "pad_token_id": tokenizer.pad_token_id}
            overrides = {**ids, **overrides}
        return load_hf_config(self.local_hf_config_path, overrides, trust_remote_code=self.trust_remote_code)

    @functools.cached_property
    def generation_config(self) -> Any:
        # optional heavy dependency: transformers loads when a worker first reads the generation config
        from verl.utils.model import get_generation_config

        return get_generation_config(self.local_hf_config_path, trust_remote_code=self.trust_remote_code)

    @property
    def architectures(self) -> list | None:
        return getattr(self.hf_config, "architectures", None)

    @property
    def share_embeddings_and_output_weights(self) -> bool:
        return bool(getattr(self.hf_config, "tie_word_embeddings", False))

    def __getstate__(self) -> dict:
        """Pickled (to the workers) without what was loaded: each process loads its own on first read."""
        return {k: v for k, v in self.__dict__.items() if k not in _LOADED}


_LOADED = ("tokenizer", "processor", "hf_config", "generation_config")
