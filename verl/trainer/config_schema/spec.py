"""The vocabulary of the config schema: one ``key(...)`` per yaml leaf, one frozen dataclass per section.

A section is a frozen dataclass whose fields are made with :func:`key` (a leaf) or :func:`section` (a nested
section). The field's annotation gives the accepted type(s) (``Optional[...]`` admits null); the metadata gives
the default, a one-line description, the valid range or choices (a tuple, or :class:`Registered`: the names a
registry holds when a value is checked), and the key's status:

- honoured: ``read_in=(paths...)`` names the modules (or packages, ending in ``/``) that read it;
- rejected unless default: ``unsupported="what is supported instead"``; the value is accepted only when it
  equals the default (or still follows its interpolation), or when ``ok(value)`` says so;
- no effect: ``inert="why no value changes what runs"``; every value of the right type is accepted (verl's own
  configs carry such keys: an FSDP1 option under FSDP2, the settings of a tool that is refused on its own).

Everything else is derived from these declarations: validation (:func:`check_config`), "did you mean" hints for
unknown keys, the typed frozen objects (:func:`build`) and ``docs/config_reference.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.utils.config import ConfigError, suggest_keys

__all__ = ["KeySpec", "Section", "key", "section", "following", "specs", "check_value", "check_config", "build", "expectation",
           "choices_message", "NOT_VERIFIED", "Registered"]

NOT_VERIFIED = "not verified on hardware"


class Registered:
    """The choices of a key that come from a registry (``choices=Registered(engine_names)``): read each time a value
    is checked or listed, so a name registered at run time (``register_engine``, ``register_rollout``) is a valid
    value and an unknown one is refused with the names registered now."""

    def __init__(self, names: Callable[[], typing.Iterable[str]]):
        self._names = names

    def __iter__(self):
        return iter(tuple(self._names()))

    def __contains__(self, value: Any) -> bool:
        return value in tuple(self._names())

    def __repr__(self) -> str:
        return f"Registered({', '.join(self)})"


class Section:
    """Mixin for section dataclasses: ``cfg["key"]`` and ``cfg.get("key", default)`` work like on a DictConfig."""

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


@dataclass(frozen=True)
class KeySpec:
    """Everything the schema says about one leaf key (``path`` is the dotted key in its yaml)."""

    path: str
    kinds: tuple  # accepted Python types; () = anything
    nullable: bool
    default: Any
    doc: str
    follows: Optional[str] = None  # the yaml interpolates the default from this key
    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    lt: Optional[float] = None
    also: tuple = ()  # sentinel values allowed outside the range (e.g. -1 = off)
    also_doc: str = ""
    choices: Optional[tuple] = None  # or Registered (read from a registry when checked)
    items: Optional[tuple] = None  # allowed elements of a list value
    read_in: tuple = ()
    unsupported: Optional[str] = None
    inert: Optional[str] = None  # accepted at any value: why no value changes what runs
    ok: Optional[Callable[[Any], bool]] = None
    cpu: str = "yes"
    gpu: str = NOT_VERIFIED
    npu: str = NOT_VERIFIED
    optional: bool = False  # only some yamls carry it (e.g. the megatron variant)

    @property
    def honoured(self) -> bool:
        return self.unsupported is None and self.inert is None

    @property
    def free_form(self) -> bool:
        """A mapping that takes arbitrary user keys (``override_config``, ``engine_kwargs.vllm`` ...)."""
        return self.kinds == (dict,)


def key(default: Any, doc: str, **meta: Any) -> Any:
    """A leaf field: ``default`` (verl's), a one-line ``doc`` and :class:`KeySpec` metadata (ranges, status)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=functools.partial(_copy, default), metadata={"key": (default, doc, meta)})
    return dataclasses.field(default=default, metadata={"key": (default, doc, meta)})


def _copy(value):
    return list(value) if isinstance(value, list) else dict(value)


def section(cls: type, optional: bool = False) -> Any:
    """A nested section field."""
    return dataclasses.field(default_factory=cls, metadata={"section": cls, "optional": optional})


def following(cls: type, source: str, name: str) -> type:
    """A copy of the flat section ``cls`` whose every key follows the same key under ``source`` (the yaml writes
    ``${oc.select:<source>.<key>,<default>}``), e.g. the reference's megatron keys following the actor's."""
    fields = [_copied(f, follows=f"{source}.{f.name}") for f in dataclasses.fields(cls)]
    return _section_class(name, fields, Section, cls)


def _copied(f: dataclasses.Field, **meta_changes) -> tuple:
    """``(name, type, field)`` of a key or section field of another section, with ``meta_changes`` applied."""
    if "section" in f.metadata:
        return f.name, f.type, section(f.metadata["section"], f.metadata.get("optional", False))
    default, doc, meta = f.metadata["key"]
    return f.name, f.type, key(default, doc, **dict(meta, **meta_changes))


def _section_class(name: str, fields: list, base: type, like: type) -> type:
    new = dataclasses.make_dataclass(name, fields, bases=(base,), frozen=True)
    new.__module__ = like.__module__  # the field annotations resolve in the original's module
    return new


def picked(cls: type, names: tuple, name: str, base: type) -> type:
    """A section with the keys ``names`` of ``cls`` (same defaults, docs and status) on top of ``base``'s own
    keys, for a yaml section that carries only some of a shared section's keys (the reward model's fsdp_config)."""
    return _section_class(name, [_copied(f) for f in dataclasses.fields(cls) if f.name in names], base, cls)


_KIND_TEXT = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
              dict: "a mapping"}


def _kinds(annotation: Any) -> tuple[tuple, bool]:
    """(accepted types, nullable) from a field annotation."""
    if annotation is Any:
        return (), True
    origin = typing.get_origin(annotation)
    if origin is Union:
        args = typing.get_args(annotation)
        kinds: list = []
        for a in args:
            if a is type(None):
                continue
            kinds.extend(_kinds(a)[0])
        return tuple(kinds), type(None) in args
    if origin in (list, tuple):
        return (list,), False
    if origin is dict:
        return (dict,), False
    return (annotation,), False


@functools.lru_cache(maxsize=None)
def specs(cls: type, prefix: str = "", optional: bool = False) -> dict[str, KeySpec]:
    """Every leaf of the section ``cls`` (recursively), by dotted path."""
    hints = typing.get_type_hints(cls)
    out: dict[str, KeySpec] = {}
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if "section" in f.metadata:
            out.update(specs(f.metadata["section"], path + ".", optional or f.metadata["optional"]))
            continue
        if "key" not in f.metadata:
            continue
        default, doc, meta = f.metadata["key"]
        kinds, nullable = _kinds(hints[f.name])
        meta = dict(meta)
        for name in ("choices", "items", "read_in", "also"):
            if meta.get(name) is not None and not callable(meta[name]) and not isinstance(meta[name], Registered):
                meta[name] = tuple(meta[name])
        meta.setdefault("optional", optional)
        out[path] = KeySpec(path=path, kinds=kinds, nullable=nullable or default is None, default=default, doc=doc,
                            **meta)
    return out


# ------------------------------------------------------------------------------------------ checking values

def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def expectation(spec: KeySpec) -> str:
    """What a valid value looks like, in words: "an integer >= 1, or -1 (never)", "a number in [0, 1]"."""
    kind = " or ".join(_KIND_TEXT.get(k, k.__name__) for k in spec.kinds) if spec.kinds else "any value"
    lo = (f"[{_fmt(spec.ge)}" if spec.ge is not None else f"({_fmt(spec.gt)}" if spec.gt is not None else None)
    hi = (f"{_fmt(spec.le)}]" if spec.le is not None else f"{_fmt(spec.lt)})" if spec.lt is not None else None)
    if lo and hi:
        text = f"{kind} in {lo}, {hi}"
    elif lo:
        text = f"{kind} {'>=' if spec.ge is not None else '>'} {lo[1:]}"
    elif hi:
        text = f"{kind} {'<=' if spec.le is not None else '<'} {hi[:-1]}"
    else:
        text = kind
    if spec.also:
        text += ", or " + " or ".join(repr(a) for a in spec.also) + (f" ({spec.also_doc})" if spec.also_doc else "")
    return text


def choices_message(path: str, value: Any, choices) -> str:
    msg = f"{path}={value!r} is not one of: " + ", ".join(str(c) for c in choices)
    close = suggest_keys(str(value), [str(c) for c in choices if c is not None], n=1) if isinstance(value, str) else []
    if close:
        msg += f" (did you mean {close[0]!r}?)"
    return msg


def _is_kind(value: Any, kinds: tuple) -> bool:
    for k in kinds:
        if k is bool and isinstance(value, bool):
            return True
        if k is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if k is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if k is str and isinstance(value, str):
            return True
        if k is list and isinstance(value, (list, tuple, ListConfig)):
            return True
        if k is dict and isinstance(value, (dict, DictConfig)):
            return True
    return False


def check_value(spec: KeySpec, value: Any, choices: Optional[tuple] = None) -> None:
    """Type, range and choices of one value; raise ConfigError naming the key and what is allowed."""
    choices = choices if choices is not None else spec.choices
    if value is None:
        if spec.nullable or (choices is not None and None in choices):
            return
        raise ConfigError(f"{spec.path}=None must be {expectation(spec)} (null is not allowed here)")
    if spec.kinds and not _is_kind(value, spec.kinds):
        raise ConfigError(f"{spec.path}={value!r} must be {expectation(spec)}")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value not in spec.also:
        if ((spec.ge is not None and not value >= spec.ge) or (spec.gt is not None and not value > spec.gt)
                or (spec.le is not None and not value <= spec.le) or (spec.lt is not None and not value < spec.lt)):
            raise ConfigError(f"{spec.path}={value!r} must be {expectation(spec)}")
    if choices is not None and value not in choices:
        raise ConfigError(choices_message(spec.path, value, choices))
    if spec.items is not None and isinstance(value, (list, tuple, ListConfig)):
        for item in value:
            if item not in spec.items:
                raise ConfigError(choices_message(spec.path, item, spec.items))


def accepted(spec: KeySpec, value: Any, user_set: bool = True) -> bool:
    """Whether a rejected-unless-default key may hold ``value``."""
    if not user_set or value == spec.default:
        return True
    if isinstance(value, (list, tuple)) and isinstance(spec.default, (list, tuple)):
        if list(value) == list(spec.default):
            return True
    return bool(spec.ok and spec.ok(value))


def _plain(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _leaf_paths(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key of ``cfg`` (sections and leaves), without resolving interpolations."""
    raw = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    return _paths(raw, prefix)


def _paths(node: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in node.items():
        path = f"{prefix}{k}"
        out.append(path)
        if isinstance(v, dict) and v:
            out.extend(_paths(v, path + "."))
    return out


_ABSENT = object()


def _lookup(tree: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


# keys that verl's own example config files carry although no verl code reads them: accepted with a warning (a
# script that runs on verl runs here), where any other unknown key close to a known one is refused as a likely typo
VERL_UNREAD_KEYS = {
    "actor_rollout_ref.rollout.sglang_rollout_mode": "verl reads no such key (the rollout mode is rollout.mode)",
    "reward_model.model.fsdp_config.min_num_params": "verl reads reward_model.model.fsdp_config.wrap_policy."
                                                     "min_num_params",
}


def check_config(cfg: DictConfig, schema: type, *, skip: Callable[[str], bool] = lambda p: False,
                 choices: Optional[dict] = None, warn: Callable[[str], None] = print,
                 resolved: Optional[dict] = None) -> None:
    """Check every key of ``cfg`` against ``schema``: unknown keys (a close match is an error with "did you mean",
    others a warning), types, ranges and choices, and keys that are accepted only at their default.

    ``resolved``: ``cfg`` already converted with interpolations resolved (resolving is the slow part)."""
    table = specs(schema)
    raw = OmegaConf.to_container(cfg, resolve=False)
    if resolved is None:
        resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    sections = {p.rsplit(".", i)[0] for p in table for i in range(1, p.count(".") + 1)}
    free = [p for p, s in table.items() if s.free_form]
    for path in _paths(raw):
        if path in table or path in sections or path.startswith("hydra") or skip(path):
            continue
        if any(path.startswith(f + ".") for f in free):
            continue
        if path in VERL_UNREAD_KEYS:
            warn(f"warning: '{path}' is ignored: {VERL_UNREAD_KEYS[path]}")
            continue
        close = suggest_keys(path, list(table), cutoff=0.8)
        if close:
            raise ConfigError(f"unknown config key '{path}' (did you mean " + " or ".join(f"'{c}'" for c in close) + "?)")
        warn(f"warning: '{path}' is not a known config key; nothing in this trainer reads it")
    for path, spec in table.items():
        if skip(path):
            continue
        written = _lookup(raw, path)
        if written is _ABSENT or written == "???":
            continue  # absent: the default applies; mandatory '???' keys are checked by the entry point
        if isinstance(written, str) and written.startswith("${"):
            continue  # still follows its source key, which is checked under its own name
        value = _lookup(resolved, path)
        check_value(spec, value, (choices or {}).get(path))
        if spec.follows is not None and value == _lookup(resolved, spec.follows):
            continue  # the same value as its source key (a config resolved before validation has no ${...} left)
        if spec.unsupported is not None and not accepted(spec, value):
            raise ConfigError(f"{path}={value!r} is not supported: {spec.unsupported}")


# ------------------------------------------------------------------------------------------ typed objects

def build(cls: type, node: Any) -> Any:
    """A frozen ``cls`` instance from a (resolved) config node; keys ``cls`` does not declare are dropped."""
    data = _plain(node) if node is not None else {}
    data = data if isinstance(data, dict) else {}
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if "section" in f.metadata and isinstance(value, dict):
            value = build(f.metadata["section"], value)
        kwargs[f.name] = value
    return cls(**kwargs)
