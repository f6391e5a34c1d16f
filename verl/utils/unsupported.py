"""One way to say "verl has this, we do not yet": a clear NotImplementedError at call time, never an ImportError.

Code written against verl imports many names at the top of a script. A name whose capability this library does
not have yet (Megatron, the agent loop, resource-pool splitting ...) still imports, so the rest of the script
runs; calling it raises ``NotImplementedError`` naming the capability, the verl config key that would turn it
on, and what works instead.
"""

from __future__ import annotations

from typing import NoReturn

__all__ = ["NotSupportedYet", "unsupported", "unsupported_class"]


class NotSupportedYet(NotImplementedError):
    """A verl name that exists here but whose capability is not implemented yet."""

    def __init__(self, name: str, capability: str, config: str | None = None, instead: str | None = None):
        msg = f"{name} is part of {capability}, which this library does not support yet"
        if config:
            msg += f" (in verl it is enabled by {config})"
        msg += "."
        if instead:
            msg += f" Use {instead} instead."
        super().__init__(msg)
        self.name, self.capability, self.config = name, capability, config


def unsupported(name: str, capability: str, config: str | None = None, instead: str | None = None) -> NoReturn:
    """Raise :class:`NotSupportedYet` for ``name``."""
    raise NotSupportedYet(name, capability, config, instead)


def unsupported_class(name: str, capability: str, config: str | None = None, instead: str | None = None,
                      bases: tuple = (), module: str | None = None) -> type:
    """A class named ``name`` that raises :class:`NotSupportedYet` when instantiated (subclassing it works)."""

    def __init__(self, *args, **kwargs):
        unsupported(name, capability, config, instead)

    doc = f"Not supported yet: {capability}" + (f" ({config})." if config else ".")
    namespace = {"__init__": __init__, "__doc__": doc, "__verl_unsupported__": capability}
    if module:
        namespace["__module__"] = module
    return type(name, bases or (object,), namespace)
