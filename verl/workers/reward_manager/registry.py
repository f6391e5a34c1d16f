"""Name -> reward manager class registry (``reward_model.reward_manager`` / ``reward_manager.name``)."""

from __future__ import annotations

from typing import Callable

__all__ = ["REWARD_MANAGER_REGISTRY", "register", "get_reward_manager_cls"]

REWARD_MANAGER_REGISTRY: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: ``@register("my_manager")`` makes ``reward_model.reward_manager=my_manager`` work."""

    if not isinstance(name, str) or not name:
        raise ValueError(f"register(name): name must be a non-empty str, got {name!r}")

    def decorator(cls: type) -> type:
        existing = REWARD_MANAGER_REGISTRY.get(name)
        # the same class re-registered (also after a module reload: same module and name) is a no-op
        reloaded = existing is not None and (existing.__module__, existing.__qualname__) == (cls.__module__,
                                                                                         cls.__qualname__)
        if existing is not None and existing is not cls and not reloaded:
            raise ValueError(f"reward manager {name!r} is already registered to {existing.__module__}."
                             f"{existing.__qualname__}; pick another name for {cls.__module__}.{cls.__qualname__}")
        REWARD_MANAGER_REGISTRY[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    """The class registered under ``name``; a ValueError listing the registered names otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"reward manager name must be a str, got {type(name).__name__} ({name!r})")
    try:
        return REWARD_MANAGER_REGISTRY[name]
    except KeyError:
        registered = ", ".join(sorted(REWARD_MANAGER_REGISTRY)) or "none (the registry is empty)"
        raise ValueError(
            f"Unknown reward manager {name!r} (reward_model.reward_manager / reward_manager.name). "
            f"Registered: {registered}. To use your own class, decorate it with "
            "`@verl.workers.reward_manager.register(<name>)` and import it before training, or set "
            "reward_manager.source=importlib with reward_manager.module.path=<file.py> and "
            "reward_manager.module.name=<class>."
        ) from None
