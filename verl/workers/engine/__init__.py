"""Training engines: one interface (``TrainEngine``) that owns the training loop, one implementation per way of
sharding a model. Roles and recipes hand an engine a loss function; see ``base.py``.

``get_engine_cls(strategy)`` maps verl's ``strategy`` keys (``fsdp``, ``fsdp2``, ``megatron``) to an engine class;
the Megatron engine (``engine/megatron.py``) is imported on first use: FSDP workers never load it.
"""

from verl.workers.engine.base import OUTPUTS, LossContext, MicroBatchSpec, TrainEngine, TrainSpec
from verl.workers.engine.config import EngineConfig
from verl.workers.engine.fsdp import FSDPEngine

__all__ = ["TrainEngine", "FSDPEngine", "EngineConfig", "MicroBatchSpec", "TrainSpec", "LossContext", "OUTPUTS",
           "ENGINES", "get_engine_cls", "register_engine"]

ENGINES: dict[str, type[TrainEngine]] = {"fsdp": FSDPEngine, "fsdp2": FSDPEngine}


def register_engine(strategy: str, engine_cls: type[TrainEngine]) -> None:
    """Make ``strategy=<name>`` build ``engine_cls`` (which must offer ``build(EngineConfig, device_mesh, tokenizer)``)."""
    ENGINES[strategy] = engine_cls


def get_engine_cls(strategy: str) -> type[TrainEngine]:
    if strategy == "megatron" and strategy not in ENGINES:
        # optional heavy dependency: the strategy=megatron engine (megatron-core, and ~0.6 s of
        # torch.distributed.optim at import) that FSDP workers never need
        from verl.workers.engine.megatron import MegatronEngine

        register_engine("megatron", MegatronEngine)
    try:
        return ENGINES[strategy]
    except KeyError:
        raise ValueError(f"strategy={strategy!r} has no training engine here; choose one of: "
                         f"{', '.join(sorted(ENGINES))}") from None
