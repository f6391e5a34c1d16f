"""``DataProtoConfig``: process-wide DataProto switches (re-exported by :mod:`verl.protocol`)."""

from __future__ import annotations

import os


class _DataProtoConfigMeta(type):
    """Gives ``DataProtoConfig.auto_padding`` a class-level getter/setter that also reads the environment."""

    _config: dict = {}
    auto_padding_key = "_verl_auto_padding"

    @property
    def auto_padding(cls) -> bool:
        from_env = os.getenv("VERL_AUTO_PADDING", "FALSE").strip().upper() in ("TRUE", "1", "YES")
        return from_env or bool(cls._config.get(cls.auto_padding_key, False))

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._config[cls.auto_padding_key] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide switches. ``auto_padding`` (or env ``VERL_AUTO_PADDING=1``) lets ``chunk`` accept batch
    sizes that are not a multiple of the world size; the dispatch layer then pads before and unpads after."""
