"""Read a key from a config that may be an OmegaConf node, a dataclass, a plain dict or None."""

from collections.abc import Mapping
from typing import Any


def cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """``config.a.b`` for ``key="a.b"``; ``default`` when a level is missing or the value is None."""
    node = config
    for part in key.split("."):
        if node is None:
            return default
        if isinstance(node, Mapping):
            node = node.get(part, None)
        else:
            node = getattr(node, part, None)
    return default if node is None else node
