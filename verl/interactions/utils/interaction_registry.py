"""Load interactions from ``actor_rollout_ref.rollout.multi_turn.interaction_config_path``::

    interaction:
      - name: answer_check                                   # rows choose it: extra_info.interaction_kwargs.name
        class_name: verl.interactions.answer_check_interaction.AnswerCheckInteraction
        config: {max_attempts: 2}
"""

from __future__ import annotations

import importlib
import os

from omegaconf import OmegaConf

from ..base import BaseInteraction

__all__ = ["InteractionConfigError", "load_interaction_config", "initialize_interactions_from_config"]

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


class InteractionConfigError(ValueError):
    """The interaction config yaml is missing, malformed, or names a class that cannot be built."""


def load_interaction_config(path: str) -> list[dict]:
    where = f"{KEY}={path}"
    full = os.path.expanduser(str(path))
    if not os.path.isfile(full):
        raise InteractionConfigError(f"{where}: no such file; point it at a yaml with a top-level 'interaction:' list")
    raw = OmegaConf.to_container(OmegaConf.load(full), resolve=True)
    if not isinstance(raw, dict) or not isinstance(raw.get("interaction"), list):
        raise InteractionConfigError(f"{where}: expected a top-level 'interaction:' list of {{name, class_name, "
                                     f"config}}")
    entries, names = [], set()
    for i, entry in enumerate(raw["interaction"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str) or "." not in entry["class_name"]:
            raise InteractionConfigError(f"{where}: interaction[{i}] has no class_name (import path of a "
                                         f"BaseInteraction subclass)")
        module_name, _, attr = entry["class_name"].rpartition(".")
        name = str(entry.get("name") or attr)
        if name in names:
            raise InteractionConfigError(f"{where}: interaction[{i}]: a second interaction named {name!r}")
        names.add(name)
        config = dict(entry.get("config") or {})
        config["name"] = name
        entries.append({"name": name, "class_name": entry["class_name"], "config": config})
    return entries


def _interaction_class(class_name: str, where: str) -> type:
    module_name, _, attr = class_name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr, None)
    except ImportError as exc:
        raise InteractionConfigError(f"{where}class_name={class_name}: cannot import {module_name}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseInteraction)):
        raise InteractionConfigError(f"{where}class_name={class_name} is not a BaseInteraction subclass")
    return cls


def initialize_interactions_from_config(path) -> dict[str, BaseInteraction]:
    """name -> interaction instance (empty for a null path)."""
    if not path:
        return {}
    out = {}
    for i, entry in enumerate(load_interaction_config(path)):
        cls = _interaction_class(entry["class_name"], f"{KEY}={path}: interaction[{i}] ")
        out[entry["name"]] = cls(entry["config"])
    return out


def check_interaction_config(path) -> None:
    """Load the file and import every class (no instances), for config validation."""
    for i, entry in enumerate(load_interaction_config(path)):
        _interaction_class(entry["class_name"], f"{KEY}={path}: interaction[{i}] ")
