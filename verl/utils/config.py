"""Config helpers shared by every entry point: typed views of OmegaConf nodes and override checking.

- ``omega_conf_to_dataclass(node, Dataclass=None)``: turn a config node into a typed dataclass once (unknown keys
  in the node are ignored, missing ones take the dataclass default); without a class, the node's ``_target_`` or
  its place in the config picks one of :mod:`verl.workers.config`'s classes.
- ``check_overrides(base_cfg, overrides)``: look at Hydra command-line overrides *before* Hydra composes the
  config, so that a misspelled key fails with our message ("did you mean ...") instead of Hydra's.
- ``cfg_get(node, "a.b", default)``: read one value from an OmegaConf node, dict, dataclass or None, with a
  default for a missing level or an explicit None (the one config reader every module uses).
- ``ConfigError``: the one exception type for "the user's config is wrong"; entry points print its message
  and exit with code 2.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import importlib
import typing
import warnings
from collections.abc import Mapping
from typing import Any, Iterable

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = [
    "ConfigError",
    "cfg_get",
    "omega_conf_to_dataclass",
    "flatten_keys",
    "suggest_keys",
    "check_overrides",
    "unresolved_value",
]


class ConfigError(ValueError):
    """The user's configuration cannot be run; the message names the key and what would work."""


# the dotted yaml path (ending in '.') of the config section being built into a typed class, so that the class's
# checks name the user's key (``actor_rollout_ref.actor.clip_ratio``); '' when built outside a config
config_path_prefix: contextvars.ContextVar[str] = contextvars.ContextVar("config_path_prefix", default="")


def cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """``config.a.b`` for ``key="a.b"`` on a DictConfig, dict, dataclass or None.

    Returns ``default`` when a level is missing or the value is None. A DictConfig is asked for its keys before
    a value is read: a miss through ``hasattr`` or ``.get`` makes omegaconf build and format an exception inside
    (two per miss in struct mode, ~50 us together), and the rollout reads its config per request. Other mappings
    are read with ``.get``, everything else (dataclasses, namespaces) with ``getattr``.
    """
    node = config
    for part in key.split("."):
        if node is None:
            return default
        if isinstance(node, DictConfig):
            node = node.get(part) if part in node.keys() else None
        elif isinstance(node, Mapping):
            node = node.get(part, None)
        else:
            node = getattr(node, part, None)
    return default if node is None else node


def omega_conf_to_dataclass(config: Any, dataclass_type: type | None = None) -> Any:
    """Convert an OmegaConf node (or dict) to a dataclass, as verl does.

    - ``dataclass_type`` given: build it. Nested dataclass fields are converted recursively; keys the dataclass
      does not declare are dropped (the yaml may carry keys for other components). The typed config classes of
      :mod:`verl.workers.config` check the values on construction (a ``ConfigError`` names the yaml key).
    - ``dataclass_type=None``: the class named by the node's ``_target_`` (``verl.workers.config.FSDPActorConfig``
      in verl's yamls); without one, the class of the node's place in a PPO config
      (``verl.workers.config.config_class_for``: ``actor_rollout_ref.actor`` -> ``FSDPActorConfig`` or
      ``McoreActorConfig`` by its strategy, ``critic`` -> ``FSDPCriticConfig``, ``*.optim`` ->
      ``FSDPOptimizerConfig`` ...); a node with neither is returned as a plain resolved dict.
    - an empty node gives ``dataclass_type()`` (None without a type); a value that is not a config node (an
      object already built) is returned unchanged.
    """
    if config is None or (isinstance(config, (DictConfig, ListConfig, dict, list)) and len(config) == 0):
        return None if dataclass_type is None else dataclass_type()
    if not isinstance(config, (DictConfig, ListConfig, dict, list)):
        return config
    where = _node_path(config)
    if dataclass_type is None:
        dataclass_type = _target_class(config, where)
        if dataclass_type is None:
            return OmegaConf.to_container(config, resolve=True) if isinstance(config, (DictConfig, ListConfig)) \
                else config
    if not dataclasses.is_dataclass(dataclass_type):
        raise TypeError(f"{dataclass_type} is not a dataclass")
    if isinstance(config, (DictConfig, ListConfig)):
        config = OmegaConf.to_container(config, resolve=True)
    token = config_path_prefix.set(f"{where}." if where else "")
    try:
        return _build(dataclass_type, config)
    finally:
        config_path_prefix.reset(token)


def _build(dataclass_type: type, config: dict) -> Any:
    kwargs = {}
    hints = _field_types(dataclass_type)
    prefix = config_path_prefix.get()
    for field in dataclasses.fields(dataclass_type):
        if not field.init or field.name not in config:
            continue
        value = config[field.name]
        sub = field.metadata.get("section") or hints.get(field.name)
        if isinstance(sub, type) and dataclasses.is_dataclass(sub) and isinstance(value, dict):
            token = config_path_prefix.set(f"{prefix}{field.name}." if prefix else "")
            try:
                value = _build(sub, value)
            finally:
                config_path_prefix.reset(token)
        kwargs[field.name] = value
    return dataclass_type(**kwargs)


# the class of a yaml section that carries no ``_target_``, by its place in the config: imported by name (like a
# ``_target_``) so that this module stays below the workers
SECTION_CLASSES = "verl.workers.config:config_class_for"


def _node_path(config: Any) -> str:
    """The dotted key of a DictConfig inside its root config ('' for a root or a plain dict)."""
    if not isinstance(config, DictConfig):
        return ""
    try:
        return str(config._get_full_key(None) or "")
    except Exception:  # a node detached from its parent has no path
        return ""


def _import_object(name: str) -> Any:
    module, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"cannot import {name!r}: {err}") from None


def _target_class(config: Any, where: str) -> type | None:
    target = config.get("_target_") if isinstance(config, (DictConfig, dict)) else None
    if target:
        cls = _import_object(str(target))
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ConfigError(f"{where + '.' if where else ''}_target_={target!r} is not a dataclass")
        return cls
    if not where or not isinstance(config, DictConfig):
        return None
    return _import_object(SECTION_CLASSES)(where, config)


def _field_types(dataclass_type: type) -> dict:
    try:
        return typing.get_type_hints(dataclass_type)
    except Exception:
        return {f.name: f.type for f in dataclasses.fields(dataclass_type)}


def flatten_keys(cfg: Any, prefix: str = "") -> list[str]:
    """Every dotted key path in ``cfg`` (dict nodes and leaves), without resolving interpolations."""
    keys: list[str] = []
    if isinstance(cfg, DictConfig):
        items = [(k, cfg._get_node(k)) for k in cfg.keys()]
    elif isinstance(cfg, dict):
        items = list(cfg.items())
    else:
        return keys
    for k, node in items:
        path = f"{prefix}{k}"
        keys.append(path)
        if isinstance(node, (DictConfig, dict)):
            keys.extend(flatten_keys(node, path + "."))
    return keys


def suggest_keys(key: str, candidates: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """Close matches for a misspelled dotted key: whole-path matches first, then same-parent leaf matches."""
    candidates = list(candidates)
    leaf = key.rsplit(".", 1)[-1]
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    siblings = [c for c in candidates if (c.rsplit(".", 1)[0] if "." in c else "") == parent]
    by_leaf = {c.rsplit(".", 1)[-1]: c for c in siblings}
    found = [by_leaf[m] for m in difflib.get_close_matches(leaf, list(by_leaf), n=n, cutoff=cutoff)]
    if not found:  # wrong parent as well: compare whole paths, strictly
        found = difflib.get_close_matches(key, candidates, n=n, cutoff=max(cutoff, 0.8))
    if not found:  # a leaf that exists under another parent (e.g. `trainer.ppo_epochs`)
        found = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf]
    return found[:n]


def _is_free_form(node: Any) -> bool:
    """Empty dicts in the YAML (override_config, engine_kwargs ...) take arbitrary user keys."""
    return isinstance(node, DictConfig) and len(node) == 0


def _longest_existing_prefix(cfg: DictConfig, parts: list[str]) -> tuple[int, Any]:
    node: Any = cfg
    depth = 0
    for part in parts:
        if isinstance(node, DictConfig) and part in node.keys():
            node = node._get_node(part)
            depth += 1
        else:
            break
    return depth, node


def _free_form_paths(cfg: DictConfig) -> list[str]:
    return [k for k in flatten_keys(cfg) if _is_free_form(OmegaConf.select(cfg, k, default=None))]


def check_overrides(base_cfg: DictConfig, overrides: list[str], known: Iterable[str] = (),
                    free_form: Iterable[str] = ()) -> list[str]:
    """Check Hydra overrides against the keys of ``base_cfg``; raise one ConfigError naming every bad one (a
    ported command line with several keys we do not know shows them all at once).

    - ``key=value``: the key must exist (Hydra's struct mode would refuse it too, with a less helpful message).
    - ``+key=value`` / ``++key=value``: allowed under a free-form dict (an empty dict in the YAML, e.g.
      ``actor_rollout_ref.model.override_config``); elsewhere a new key that is a near-miss of an existing key
      is refused as a probable typo, and any other new key is allowed with a warning (recipes add their own).
      ``+key=value`` on an existing key follows Hydra: accepted when the key is null or the value a list/dict.
      ``known``: keys the caller's schema declares although the yaml does not carry them (optional keys); adding
      one of those is fine (its value is checked with the rest of the config). ``free_form``: keys the schema
      declares free-form (a mapping of user keys) although the yaml gives them default entries; a new key under
      one is fine.
    - ``~key``: the key must exist.
    Hydra's own overrides (``hydra.*``, ``hydra/...``) and config-group selections are skipped.
    Returns warnings (strings) for the caller to print.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except Exception as e:  # hydra's grammar error already names the bad override
        raise ConfigError(f"cannot parse command-line override: {e}") from None

    all_keys = flatten_keys(base_cfg)
    known = set(known) | {_FREE_FORM_MARK + f for f in free_form}
    warnings: list[str] = []
    problems: list[str] = []
    for ov in parsed:
        try:
            warning = _check_override(ov, base_cfg, all_keys, known)
        except ConfigError as err:
            problems.append(str(err))
            continue
        if warning:
            warnings.append(warning)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} overrides are not accepted: " + "; ".join(
            f"({i}) {p}" for i, p in enumerate(problems, 1)))
    return warnings


_FREE_FORM_MARK = "free-form:"


def _check_override(ov, base_cfg: DictConfig, all_keys: list[str], known: set = frozenset()) -> str | None:
    """None when the parsed override ``ov`` is fine, a warning for a new key outside free-form sections; raises
    ConfigError when it is not accepted."""
    key = ov.key_or_group
    if key.startswith("hydra") or "/" in key or ov.package is not None:
        return None
    parts = key.split(".")
    depth, node = _longest_existing_prefix(base_cfg, parts)
    exists = depth == len(parts)
    if ov.type == OverrideType.CHANGE or ov.type == OverrideType.DEL:
        if exists:
            return None
        # under a free-form dict Hydra needs '+': say so
        parent = OmegaConf.select(base_cfg, ".".join(parts[:depth]), default=None) if depth else base_cfg
        if depth and _is_free_form(parent) or _inside_free_form(base_cfg, parts[:depth]):
            raise ConfigError(f"'{key}' is not set in the default config; add it with a leading '+': +{ov.input_line}")
        raise ConfigError(_unknown_key_message(key, all_keys, base_cfg))
    # ADD / FORCE_ADD
    if exists:
        if ov.type == OverrideType.ADD and not _hydra_adds_over(base_cfg, key, ov):
            raise ConfigError(
                f"'{key}' already exists in the config; set it without the '+': {ov.input_line.lstrip('+')}")
        return None
    if _inside_free_form(base_cfg, parts[:depth]) or key in known:
        return None
    if any(_FREE_FORM_MARK + ".".join(parts[:i]) in known for i in range(1, len(parts))):
        return None
    if depth and OmegaConf.select(base_cfg, ".".join(parts[:depth]), default=0) is None:
        return None  # under a null key Hydra makes a dict (override_optimizer_config: null); the schema checks it
    close = suggest_keys(key, all_keys, cutoff=0.8)
    if close:
        raise ConfigError(_unknown_key_message(key, all_keys, base_cfg, suggestions=close))
    return f"warning: '{key}' is not a known config key; adding it as requested by '{ov.input_line}'"


def _hydra_adds_over(cfg: DictConfig, key: str, ov) -> bool:
    """Whether Hydra accepts ``+key=value`` on an existing key: it does when the current value is null or the new
    value is a list or dict (verl's scripts rely on it, e.g. ``+data.response_dict_keys=[answer]``)."""
    try:
        current = OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception:  # an interpolation that does not resolve yet: not null
        current = object()
    try:
        value = ov.value()
    except Exception:
        value = None
    return current is None or isinstance(value, (list, dict))


def _inside_free_form(cfg: DictConfig, parts: list[str]) -> bool:
    node: Any = cfg
    for part in parts:
        if not isinstance(node, DictConfig) or part not in node.keys():
            return False
        node = node._get_node(part)
        if _is_free_form(node):
            return True
    return False


def _unknown_key_message(key: str, all_keys: list[str], cfg: DictConfig, suggestions: list[str] | None = None) -> str:
    suggestions = suggestions if suggestions is not None else suggest_keys(key, all_keys)
    msg = f"unknown config key '{key}'"
    if suggestions:
        msg += " (did you mean " + " or ".join(f"'{s}'" for s in suggestions) + "?)"
    else:
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
        if isinstance(node, DictConfig):
            msg += f"; keys under '{parent or '<root>'}': " + ", ".join(list(node.keys())[:30])
    free = _free_form_paths(cfg)
    if free and not suggestions:
        msg += ". To pass extra engine/model options use a free-form section with '+', e.g. +" + free[0] + ".<name>=<value>"
    return msg


def unresolved_value(cfg: DictConfig, key: str) -> Any:
    """The value as written (an interpolation stays a '${...}' string), or None when absent."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, default=None) if parent_key else cfg
    if not isinstance(parent, DictConfig) or leaf not in parent:
        return None
    node = parent._get_node(leaf)
    return node._value() if hasattr(node, "_value") else node


def quiet_searchpath_warning() -> None:
    """Recipe configs find ``ppo_trainer.yaml`` through ``pkg://verl.trainer.config``; Hydra's availability
    probe wrongly reports that folder (a data directory, not a package) as missing although it loads it."""
    warnings.filterwarnings("ignore", message=r".*path=verl\.trainer\.config is not available.*")
