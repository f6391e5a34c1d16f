"""Training engines: one interface (``TrainEngine``) that owns the training loop, one implementation per way of
sharding a model. Roles and recipes hand an engine a loss function; see ``base.py``.

``get_engine_cls(strategy)`` maps verl's ``strategy`` keys (``fsdp``, ``fsdp2``, ``megatron``) and the ones users
register with ``register_engine`` to an engine class (``registry.py``). The engine modules are imported on first
use (PEP 562): the config check reads the registry without loading torch models, and FSDP workers never load
the Megatron engine.
"""

from __future__ import annotations

from verl.utils.import_utils import lazy_exports
from verl.workers.engine.registry import ENGINES, engine_names, engine_workers, get_engine_cls, register_engine

__all__ = ["TrainEngine", "FSDPEngine", "EngineConfig", "MicroBatchSpec", "TrainSpec", "LossContext", "OUTPUTS",
           "ENGINES", "get_engine_cls", "register_engine", "engine_names", "engine_workers"]

_LAZY = {"TrainEngine": "base", "MicroBatchSpec": "base", "TrainSpec": "base", "LossContext": "base",
         "OUTPUTS": "base", "EngineConfig": "config", "FSDPEngine": "fsdp"}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
