"""What every typed config class of :mod:`verl.workers.config` shares: built on a section of the config schema
(``verl/trainer/config_schema/``), it is frozen and checked on construction the way the yaml is checked.

- types, ranges and choices of every key field (``key(...)`` metadata) raise :class:`ConfigError` naming the key;
- a key this build does not implement (``unsupported=...``) is accepted only at its default, otherwise refused
  with the key named and what is supported instead;
- nested sections given as mappings (or as a schema section of another class) become the declared class;
  OmegaConf containers become plain Python values;
- ``cfg["key"]`` and ``cfg.get("key", default)`` work as on a DictConfig (:class:`Section`).

The key of an error is the yaml path when the object was built from a config node (``omega_conf_to_dataclass``)
or as the nested section of a class built from one, else ``ClassName.field``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.trainer.config_schema.spec import Section, accepted, check_value, key, specs
from verl.utils.config import ConfigError, config_path_prefix, suggest_keys

__all__ = ["CheckedSection", "rekey", "coerce_section"]

MISSING = "???"  # a mandatory key nobody set yet (verl's MISSING); checked where the config is validated


def rekey(cls: type, name: str, default: Any, **meta_changes: Any) -> Any:
    """The key field ``name`` of the section ``cls`` with another default (same doc, range and status), for a
    subclass that differs only there (``McoreActorConfig.strategy = "megatron"``)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    _, doc, meta = f.metadata["key"]
    return key(default, doc, **dict(meta, **meta_changes))


def _plain(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def coerce_section(target: type, value: Any, where: str, strict: bool) -> Any:
    """``value`` as an instance of the section class ``target``: a mapping is built (``strict``: unknown keys are
    an error naming them, else dropped), a section of another class is copied field by field, None gives the
    defaults."""
    if isinstance(value, target):
        return value
    if value is None:
        data: dict = {}
    elif isinstance(value, (Mapping, DictConfig)):
        data = dict(_plain(value))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        strict = False
    else:
        raise ConfigError(f"{where.rstrip('.')} must be a mapping of {target.__name__} keys, got {value!r}")
    names = {f.name for f in dataclasses.fields(target) if f.init}
    data.pop("_target_", None)
    unknown = sorted(k for k in data if k not in names)
    if unknown and strict:
        hints = {k: suggest_keys(k, sorted(names), n=1) for k in unknown}
        raise ConfigError(", ".join(f"unknown key '{where}{k}'" + (f" (did you mean '{where}{hints[k][0]}'?)"
                                                                     if hints[k] else "") for k in unknown)
                          + f"; {target.__name__} keys: {', '.join(sorted(names))}")
    token = config_path_prefix.set(where)
    try:
        return target(**{k: v for k, v in data.items() if k in names})
    finally:
        config_path_prefix.reset(token)


def check_section_values(obj: Any, prefix: str) -> None:
    """Types, ranges, choices and default-only keys of every key field of ``obj`` (nested schema sections that
    do not check themselves are checked here)."""
    table = specs(type(obj), prefix)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if "section" in f.metadata:
            if value is not None and not isinstance(value, CheckedSection):
                check_section_values(value, f"{prefix}{f.name}.")
            continue
        spec = table.get(prefix + f.name)
        if spec is None or (isinstance(value, str) and value == MISSING):
            continue
        check_value(spec, value)
        if spec.unsupported is not None and spec.follows is None and not accepted(spec, value):
            raise ConfigError(f"{spec.path}={value!r} is not supported: {spec.unsupported}")


class CheckedSection(Section):
    """Mixin of the typed config classes (frozen dataclasses built on schema sections); see the module doc."""

    def __post_init__(self) -> None:
        prefix = config_path_prefix.get() or f"{type(self).__name__}."
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if "section" in f.metadata:
                target = f.metadata["section"]
                if not isinstance(value, target):
                    object.__setattr__(self, f.name, coerce_section(target, value, f"{prefix}{f.name}.", strict=True))
            elif isinstance(value, (DictConfig, ListConfig)):
                object.__setattr__(self, f.name, _plain(value))
        check_section_values(self, prefix)
