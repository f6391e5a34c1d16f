"""Profiler settings under verl's names: ``ProfilerConfig`` (one role's ``profiler`` section, or the global one) and
one dataclass per tool's ``tool_config`` entry.

``ProfilerConfig.from_config(node)`` reads a role's ``profiler`` section (a DictConfig, a dict or None); its
``tool_config`` becomes the settings of the selected tool only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

__all__ = ["ProfilerConfig", "TorchProfilerToolConfig", "TorchMemoryToolConfig", "NsightToolConfig", "NPUToolConfig"]

TOOLS = ("nsys", "npu", "torch", "torch_memory")


class _Mapping:
    """``cfg["key"]`` and ``cfg.get("key", default)``, as on a DictConfig."""

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


@dataclass
class NsightToolConfig(_Mapping):
    """``tool_config.nsys``: ``discrete`` = one capture range per worker call instead of one per step."""

    discrete: bool = False
    name: str = "nsight"


@dataclass
class TorchProfilerToolConfig(_Mapping):
    """``tool_config.torch``: verl's mini-batch range inside an update (only the defaults are accepted here: a
    trace covers a whole worker call)."""

    step_start: int = 0
    step_end: Optional[int] = None
    name: str = "torch"


@dataclass
class TorchMemoryToolConfig(_Mapping):
    """``tool_config.torch_memory``: the CUDA allocator history kept for the snapshot."""

    trace_alloc_max_entries: int = 100_000
    stack_depth: int = 32
    name: str = "torch_memory"


@dataclass
class NPUToolConfig(NsightToolConfig):
    """``tool_config.npu`` (Ascend profiler settings)."""

    contents: list = field(default_factory=list)
    level: str = "level0"
    analysis: bool = True
    name: str = "npu"


TOOL_CONFIGS = {"nsys": NsightToolConfig, "npu": NPUToolConfig, "torch": TorchProfilerToolConfig,
                "torch_memory": TorchMemoryToolConfig}


@dataclass
class ProfilerConfig(_Mapping):
    """One role's profiling: which ``tool``, whether this role is profiled (``enable``), on which ranks
    (``all_ranks``, else ``ranks``, else rank 0) and where results go (``save_path``)."""

    tool: Optional[str] = None
    enable: bool = False
    all_ranks: bool = False
    ranks: list = field(default_factory=list)
    save_path: Optional[str] = None
    tool_config: Any = None
    global_tool_config: Optional[Any] = None

    def __post_init__(self) -> None:
        if self.tool is not None and self.tool not in TOOLS:
            raise ValueError(f"profiler tool={self.tool!r} is not one of: {', '.join(TOOLS)} (or null: off)")
        if not isinstance(self.ranks, (list, tuple, set)):
            raise TypeError(f"profiler ranks must be a list of ranks, got {self.ranks!r}")
        self.ranks = list(self.ranks)

    @classmethod
    def from_config(cls, node: Any) -> "ProfilerConfig":
        """A role's ``profiler`` section as a ProfilerConfig (None or {}: profiling off)."""
        if isinstance(node, ProfilerConfig):
            return node
        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
        node = dict(node or {})
        known = {f.name for f in fields(cls)}
        config = cls(**{k: v for k, v in node.items() if k in known})
        config.tool_config = tool_settings(config.tool, config.tool_config)
        return config

    def selects(self, rank: int) -> bool:
        """Whether ``rank`` is profiled: every rank with ``all_ranks``, else the listed ``ranks``, else rank 0."""
        if self.all_ranks:
            return True
        return rank in self.ranks if self.ranks else rank == 0

    def union(self, other: "ProfilerConfig") -> "ProfilerConfig":
        """Profile what either config profiles (same tool)."""
        self._same_tool(other)
        return ProfilerConfig(tool=self.tool, enable=self.enable or other.enable,
                              all_ranks=self.all_ranks or other.all_ranks,
                              ranks=sorted(set(self.ranks) | set(other.ranks)), save_path=self.save_path,
                              tool_config=self.tool_config,
                              global_tool_config=self.global_tool_config or other.global_tool_config)

    def intersect(self, other: "ProfilerConfig") -> "ProfilerConfig":
        """Profile what both configs profile (same tool)."""
        self._same_tool(other)
        return ProfilerConfig(tool=self.tool, enable=self.enable and other.enable,
                              all_ranks=self.all_ranks and other.all_ranks,
                              ranks=sorted(set(self.ranks) & set(other.ranks)), save_path=self.save_path,
                              tool_config=self.tool_config,
                              global_tool_config=self.global_tool_config or other.global_tool_config)

    def _same_tool(self, other: "ProfilerConfig") -> None:
        if self.tool != other.tool:
            raise ValueError(f"cannot combine profiler configs of different tools: {self.tool} and {other.tool}")


def tool_settings(tool: Optional[str], tool_config: Any) -> Any:
    """The settings dataclass of ``tool`` from a ``tool_config`` section: either the per-tool mapping of the yaml
    (``{nsys: ..., torch: ...}``, the entry of ``tool`` is taken) or that entry itself."""
    if isinstance(tool_config, DictConfig):
        tool_config = OmegaConf.to_container(tool_config, resolve=True)
    if tool is None or tool_config is None or not isinstance(tool_config, dict):
        return tool_config
    entry = tool_config.get(tool, tool_config) or {}
    cls = TOOL_CONFIGS[tool]
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in entry.items() if k in known})
