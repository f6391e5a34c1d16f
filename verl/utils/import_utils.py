"""Optional imports and user-supplied code (verl's names)."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import warnings
from functools import lru_cache
from typing import Any

__all__ = ["is_vllm_available", "is_sglang_available", "is_megatron_core_available", "is_trl_available",
           "is_nvtx_available", "import_external_libs", "load_plugins", "import_user_modules", "PLUGIN_GROUP",
           "load_class", "load_module", "load_extern_type", "load_extern_object",
           "deprecated"]


@lru_cache(maxsize=None)
def _available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def is_vllm_available() -> bool:
    return _available("vllm")


def is_sglang_available() -> bool:
    return _available("sglang")


def is_megatron_core_available() -> bool:
    return _available("megatron.core")


def is_trl_available() -> bool:
    return _available("trl")


def is_nvtx_available() -> bool:
    return _available("nvtx")


def import_external_libs(external_libs: str | list[str] | None = None) -> None:
    """Import modules that register custom model classes, engines, rollouts, estimators or losses
    (``actor_rollout_ref.model.external_lib``)."""
    if external_libs is None:
        return
    if isinstance(external_libs, str):
        external_libs = [external_libs]
    for lib in external_libs:
        importlib.import_module(str(lib))


PLUGIN_GROUP = "verl.plugins"
_plugins_loaded: list[str] | None = None


def load_plugins() -> list[str]:
    """Import every module an installed package declares in the ``verl.plugins`` entry-point group (once per
    process; a package's ``[project.entry-points."verl.plugins"] name = "my_pkg.register"``), so that what it
    registers is there without ``external_lib``. Returns the entry points loaded. A plugin that fails to import
    raises ImportError naming it."""
    global _plugins_loaded
    if _plugins_loaded is None:
        loaded = []
        for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
            try:
                ep.load()
            except Exception as exc:
                raise ImportError(f"the {PLUGIN_GROUP} entry point {ep.name} = {ep.value} failed to import: "
                                  f"{type(exc).__name__}: {exc}") from exc
            loaded.append(ep.name)
        _plugins_loaded = loaded
    return list(_plugins_loaded)


def import_user_modules(external_libs: str | list[str] | None = None) -> None:
    """What a user registers, in this process: the ``verl.plugins`` entry points, then ``external_libs``. The driver
    calls it before the config check and every worker before it builds an engine or a rollout."""
    load_plugins()
    import_external_libs(external_libs)


def load_class(target: Any) -> Any:
    """``target`` itself, or the object a ``"package.module:Name"`` (or ``"package.module.Name"``) string names,
    imported now: how a lower layer names a default that lives in a higher one without importing it."""
    if not isinstance(target, str):
        return target
    module, _, name = target.partition(":") if ":" in target else target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def load_module(module_path: str, module_name: str | None = None):
    """Import a module from a ``.py`` file path, or from ``pkg://dotted.module`` / a dotted module name."""
    if module_path is None:
        return None
    if module_path.startswith("pkg://"):
        return importlib.import_module(module_path[len("pkg://"):])
    path = os.path.expanduser(module_path)
    if not os.path.isfile(path):
        if os.path.sep not in module_path and not module_path.endswith(".py"):
            return importlib.import_module(module_path)
        raise FileNotFoundError(f"module file not found: {module_path}")
    name = module_name or f"verl_custom_{abs(hash(os.path.abspath(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise RuntimeError(f"error while importing {module_path}: {e}") from e
    return module


def load_extern_type(file_path: str | None, type_name: str | None) -> Any:
    """``getattr(load_module(file_path), type_name)``, with a message naming both when it is missing."""
    if file_path is None:
        return None
    module = load_module(file_path)
    if not hasattr(module, type_name):
        raise AttributeError(f"'{type_name}' is not defined in {file_path}")
    return getattr(module, type_name)


def load_extern_object(module_path: str | None, object_name: str | None) -> Any:
    """verl's newer name of :func:`load_extern_type`: ``object_name`` from a ``.py`` file or module path."""
    return load_extern_type(module_path, object_name)


def deprecated(replacement: str = ""):
    """Decorator: calling the function (or building the class) warns ``DeprecationWarning`` naming ``replacement``."""

    def decorator(obj):
        what = f"{obj.__module__}.{obj.__qualname__}"
        msg = f"{what} is deprecated" + (f"; use {replacement} instead" if replacement else "")
        if isinstance(obj, type):
            original_init = obj.__init__

            @functools.wraps(original_init)
            def init(self, *args, **kwargs):
                warnings.warn(msg, DeprecationWarning, stacklevel=2)
                original_init(self, *args, **kwargs)

            obj.__init__ = init
            return obj

        @functools.wraps(obj)
        def wrapper(*args, **kwargs):
            warnings.warn(msg, DeprecationWarning, stacklevel=2)
            return obj(*args, **kwargs)

        return wrapper

    return decorator


def lazy_exports(package: str, lazy: dict[str, str], aliases: dict[str, str] | None = None):
    """``(__getattr__, __dir__)`` for a package whose names live in submodules imported on first use (PEP 562):
    ``lazy`` maps a name to its submodule, ``aliases`` an older name to the current one."""
    aliases = aliases or {}
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str):
        real = aliases.get(name, name)
        if real in lazy:
            value = getattr(importlib.import_module(f"{package}.{lazy[real]}"), real)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(lazy) | set(aliases))

    return __getattr__, __dir__
