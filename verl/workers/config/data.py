"""The typed ``data`` sections the datasets read, built on the schema's: RL prompts (``ppo_trainer.yaml``,
:class:`DataConfig`), preference rows (the preference recipes, :class:`PreferenceDataConfig`) and SFT rows
(``sft_trainer.yaml``, :class:`SFTDataConfig`). Build one with :func:`as_data_config`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from omegaconf import DictConfig

import verl.trainer.config_schema.ppo as schema
import verl.trainer.config_schema.sft as sft_schema
from verl.trainer.config_schema.spec import section
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config.base import CheckedSection, coerce_section, rekey

__all__ = ["CustomClsConfig", "SamplerConfig", "DataConfig", "PreferenceDataConfig", "SFTMultiturnConfig",
           "SFTCustomClsConfig", "SFTDataConfig", "as_data_config"]


@dataclass(frozen=True)
class CustomClsConfig(schema.CustomCls, CheckedSection):
    """``data.custom_cls``: a Dataset class of your own, loaded from a file."""


@dataclass(frozen=True)
class SamplerConfig(schema.Sampler, CheckedSection):
    """``data.sampler``: a sampler class of your own (curriculum), loaded from a file."""


@dataclass(frozen=True)
class DataConfig(schema.DataConfig, CheckedSection):
    """``data`` of ``ppo_trainer.yaml``: the RL prompt files, how prompts are rendered and cut, their order."""

    # may be null here: the recipes built on this section run without a validation set then (main_ppo's
    # validator still requires files)
    val_files: Optional[Union[str, list]] = rekey(schema.DataConfig, "val_files", schema.DataConfig.val_files)
    custom_cls: CustomClsConfig = section(CustomClsConfig)
    sampler: SamplerConfig = section(SamplerConfig)


@dataclass(frozen=True)
class PreferenceDataConfig(schema.PreferenceColumns, DataConfig):
    """``data`` of the preference recipes: :class:`DataConfig` plus the columns of preference rows."""


@dataclass(frozen=True)
class SFTMultiturnConfig(sft_schema.SFTMultiturn, CheckedSection):
    """``data.multiturn`` of ``sft_trainer.yaml``: rows that are chat message lists."""


@dataclass(frozen=True)
class SFTCustomClsConfig(sft_schema.SFTCustomCls, CheckedSection):
    """``data.custom_cls`` of ``sft_trainer.yaml``."""


@dataclass(frozen=True)
class SFTDataConfig(sft_schema.SFTData, CheckedSection):
    """``data`` of ``sft_trainer.yaml``: the SFT files, their columns, length and truncation."""

    multiturn: SFTMultiturnConfig = section(SFTMultiturnConfig)
    custom_cls: SFTCustomClsConfig = section(SFTCustomClsConfig)


def as_data_config(config: Any, cls: type = DataConfig) -> Any:
    """``config`` as a ``cls`` (:class:`DataConfig`, :class:`PreferenceDataConfig` or :class:`SFTDataConfig`).

    One passes through. A ``data`` section (a DictConfig, a mapping with any subset of its keys, or None for all
    defaults) is built once, with the schema's default for every key it leaves out; keys ``cls`` does not declare
    (a recipe's or a custom dataset's own) are left to whoever reads them. A bad value raises ``ConfigError``
    naming the key: by its path in the config (``data.max_prompt_length``), ``data.<key>`` for a section that is
    not part of a config. Another typed section (a :class:`DataConfig` given to a preference dataset) is copied
    key by key.
    """
    if isinstance(config, cls):
        return config
    if isinstance(config, DictConfig) and config._get_parent() is not None:
        return omega_conf_to_dataclass(config, cls)
    return coerce_section(cls, config, "data.", strict=False)
