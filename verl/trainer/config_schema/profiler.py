"""Schema of the profiling keys: ``global_profiler`` (which tool, which steps, where results go) and the
``profiler`` section of each role (``actor_rollout_ref.{actor,ref,rollout}``, ``critic``, ``reward_model``: whether
that role is profiled and on which ranks), plus :func:`check_profiler_config`, which holds the tool against this
machine before Ray starts.

``tool=torch`` works everywhere (Chrome traces of the profiled steps' worker calls); ``torch_memory`` needs a CUDA
GPU (allocator snapshots); ``nsys`` and ``npu`` are refused with what to use instead. See docs/profiling.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.trainer.config_schema.places import MAIN, PROFILER, PROFILER_CHECKS, PROFILING
from verl.trainer.config_schema.spec import Section, key, section
from verl.utils.config import ConfigError

__all__ = ["TOOLS", "GlobalProfilerConfig", "RoleProfilerConfig", "RolloutProfilerConfig",
           "RewardModelProfilerConfig", "check_profiler_config", "PROFILED_ROLES"]

TOOLS = (None, "nsys", "npu", "torch", "torch_memory")
GP = "global_profiler"
ACTOR = "actor_rollout_ref.actor.profiler"
PROFILED_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout", "critic",
                  "reward_model")
# the nsys / npu tools' own settings: inert unless that tool is chosen, and choosing it is refused before the run
# starts (check_profiler_config), so any value is accepted, as verl accepts them beside another tool
NO_NSYS = ("settings of the nsys tool, which is refused before the run starts (global_profiler.tool=torch records "
           "traces); they would take effect only with that tool")
NO_NPU = ("settings of the npu tool, which is refused before the run starts (global_profiler.tool=torch records "
          "traces); they would take effect only with that tool")
NO_RANGE = ("a torch trace covers whole worker calls of the steps in global_profiler.steps (a mini-batch range "
            "inside an update is not available); leave the default")
NO_STACK_DEPTH = "the CUDA memory history records stacks at PyTorch's own depth; leave 32"
NO_MEMORY_OPTIONS = "the CUDA memory history records every allocator event with full stacks; leave the default"
ON_CPU = "torch (torch_memory, nsys and npu are refused before the run starts)"
NSYS_CONTROLLER_OPTIONS = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}
NSYS_WORKER_OPTIONS = {**NSYS_CONTROLLER_OPTIONS, "capture-range": "cudaProfilerApi", "capture-range-end": None,
                       "kill": "none"}


# ------------------------------------------------------------------------------------- per-role sections

@dataclass(frozen=True)
class NsysToolConfig(Section):
    discrete: bool = key(False, "one capture per worker call (false: per step)",
                         follows=f"{GP}.global_tool_config.nsys.discrete", inert=NO_NSYS)


@dataclass(frozen=True)
class NPUToolConfig(Section):
    contents: list = key([], "what to collect: npu, cpu, memory, shapes, module, stack", inert=NO_NPU)
    level: str = key("level0", "collection level", choices=("level_none", "level0", "level1", "level2"),
                     inert=NO_NPU)
    analysis: bool = key(True, "parse the collected data", inert=NO_NPU)
    discrete: bool = key(False, "one database per worker call", inert=NO_NPU)


@dataclass(frozen=True)
class TorchToolConfig(Section):
    step_start: int = key(0, "first mini-batch of an update to record", ge=0, unsupported=NO_RANGE)
    step_end: Optional[int] = key(None, "mini-batch after the last one recorded", ge=0, unsupported=NO_RANGE)


@dataclass(frozen=True)
class TorchMemoryToolConfig(Section):
    trace_alloc_max_entries: int = key(100000, "allocator events the CUDA memory history keeps", ge=1,
                                       follows=f"{GP}.global_tool_config.torch_memory.trace_alloc_max_entries",
                                       read_in=(PROFILER,))
    stack_depth: int = key(32, "stack frames kept per allocator event", ge=1,
                           follows=f"{GP}.global_tool_config.torch_memory.stack_depth", unsupported=NO_STACK_DEPTH)


@dataclass(frozen=True)
class RoleToolConfig(Section):
    nsys: NsysToolConfig = section(NsysToolConfig)
    npu: NPUToolConfig = section(NPUToolConfig)
    torch: TorchToolConfig = section(TorchToolConfig)
    torch_memory: TorchMemoryToolConfig = section(TorchMemoryToolConfig)


@dataclass(frozen=True)
class _RoleProfilerKeys(Section):
    tool: Optional[str] = key(None, "this role's profiler", choices=TOOLS, follows=f"{GP}.tool", read_in=(PROFILER,),
                              cpu=ON_CPU)
    enable: bool = key(False, "profile this role's worker calls in the steps of global_profiler.steps",
                       read_in=(PROFILER,))
    all_ranks: bool = key(False, "profile every rank of the role", read_in=(PROFILER,))
    ranks: list = key([], "ranks to profile ([] with all_ranks=false: rank 0)", read_in=(PROFILER,))
    save_path: Optional[str] = key(None, "where results go", follows=f"{GP}.save_path", read_in=(PROFILER, MAIN))


@dataclass(frozen=True)
class RoleProfilerConfig(_RoleProfilerKeys):
    """``<role>.profiler`` of the actor, the reference policy and the critic."""

    tool_config: RoleToolConfig = section(RoleToolConfig)


@dataclass(frozen=True)
class RewardModelProfilerConfig(_RoleProfilerKeys):
    """``reward_model.profiler``: its own switches, the actor's per-tool settings."""

    tool_config: Optional[dict] = key(None, "per-tool settings", follows=f"{ACTOR}.tool_config", read_in=(PROFILER,))


@dataclass(frozen=True)
class RolloutProfilerConfig(Section):
    """``actor_rollout_ref.rollout.profiler``: follows the actor's (a rollout-only worker reads it)."""

    tool: Optional[str] = key(None, "this role's profiler", choices=TOOLS, follows=f"{GP}.tool", read_in=(PROFILER,),
                              cpu=ON_CPU)
    enable: bool = key(False, "profile the rollout's worker calls", follows=f"{ACTOR}.enable", read_in=(PROFILER,))
    all_ranks: bool = key(False, "profile every rank", follows=f"{ACTOR}.all_ranks", read_in=(PROFILER,))
    ranks: list = key([], "ranks to profile", follows=f"{ACTOR}.ranks", read_in=(PROFILER,))
    save_path: Optional[str] = key(None, "where results go", follows=f"{GP}.save_path", read_in=(PROFILER, MAIN))
    tool_config: Optional[dict] = key(None, "per-tool settings", follows=f"{ACTOR}.tool_config", read_in=(PROFILER,))


# ---------------------------------------------------------------------------------------- global section

@dataclass(frozen=True)
class NsysGlobalConfig(Section):
    discrete: bool = key(False, "one capture per worker call (false: per step)", inert=NO_NSYS)
    controller_nsight_options: dict = key(NSYS_CONTROLLER_OPTIONS, "nsys options of the driver process",
                                          inert=NO_NSYS)
    worker_nsight_options: dict = key(NSYS_WORKER_OPTIONS, "nsys options of the worker processes",
                                      inert=NO_NSYS)


@dataclass(frozen=True)
class TorchMemoryGlobalConfig(Section):
    trace_alloc_max_entries: int = key(100000, "allocator events the CUDA memory history keeps", ge=1,
                                       read_in=(PROFILER,))
    stack_depth: int = key(32, "stack frames kept per allocator event", ge=1, unsupported=NO_STACK_DEPTH)
    context: str = key("all", "allocator events that record a stack", unsupported=NO_MEMORY_OPTIONS)
    stacks: str = key("all", "python or all (Python and C++) stacks", unsupported=NO_MEMORY_OPTIONS)
    kw_args: dict = key({}, "more arguments of the memory recorder", unsupported=NO_MEMORY_OPTIONS)


@dataclass(frozen=True)
class GlobalToolConfig(Section):
    nsys: NsysGlobalConfig = section(NsysGlobalConfig)
    torch_memory: TorchMemoryGlobalConfig = section(TorchMemoryGlobalConfig)


@dataclass(frozen=True)
class GlobalProfilerConfig(Section):
    """``global_profiler``: the tool, the training steps it records and where results go."""

    tool: Optional[str] = key(None, "torch (Chrome traces) | torch_memory (CUDA memory snapshots) | nsys | npu | "
                              "null (off)", choices=TOOLS, read_in=(PROFILER_CHECKS, PROFILER), cpu=ON_CPU)
    steps: Optional[list] = key(None, "training steps to profile, e.g. [1,5] (null: none)", read_in=(PROFILING,))
    profile_continuous_steps: bool = key(False, "consecutive listed steps are profiled as one (their results go to "
                                         "the folder of the first)", read_in=(PROFILING,))
    save_path: str = key("outputs/profile", "results: <save_path>/<step>/<role>/prof_rank-<rank>...",
                         read_in=(PROFILER, MAIN))
    global_tool_config: GlobalToolConfig = section(GlobalToolConfig)


# --------------------------------------------------------------------------------------------- checks

def _needs(key_name: str, tool: str, device: str) -> Optional[str]:
    """Why ``tool`` cannot run on ``device`` (None: it can)."""
    instead = f"use {key_name}=torch for traces of the profiled steps"
    if tool == "torch_memory" and device != "cuda":
        return (f"{key_name}=torch_memory records the CUDA memory allocator and needs a CUDA GPU (this run's device "
                f"is {device}); {instead}")
    if tool == "nsys":
        if device != "cuda":
            return f"{key_name}=nsys (Nsight Systems) needs a CUDA GPU (this run's device is {device}); {instead}"
        return f"{key_name}=nsys: Nsight Systems profiling is not available here; {instead} (CUDA kernels included)"
    if tool == "npu":
        if device != "npu":
            return f"{key_name}=npu needs an Ascend NPU (this run's device is {device}); {instead}"
        return f"{key_name}=npu: Ascend NPU profiling is not available here; {instead}"
    return None


def _steps(config: DictConfig) -> list:
    steps = OmegaConf.select(config, f"{GP}.steps")
    if steps is None:
        return []
    if not isinstance(steps, (list, ListConfig)) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in steps):
        raise ConfigError(f"{GP}.steps={OmegaConf.to_container(steps) if isinstance(steps, ListConfig) else steps!r} "
                          "must be a list of training steps (integers >= 1), e.g. [1,5], or null")
    return list(steps)


def check_profiler_config(config: DictConfig, device: str) -> None:
    """Refuse a tool this machine cannot run (naming the key and what to use); warn when profiling is asked for
    but would record nothing."""
    keys = [f"{GP}.tool"] + [f"{role}.profiler.tool" for role in PROFILED_ROLES]
    for key_name in keys:
        tool = OmegaConf.select(config, key_name)
        problem = _needs(key_name, tool, device) if tool is not None else None
        if problem:
            raise ConfigError(problem)
    steps, tool = _steps(config), OmegaConf.select(config, f"{GP}.tool")
    if tool is None:
        if steps:
            print(f"warning: {GP}.steps={steps} but {GP}.tool is null: nothing is profiled; set {GP}.tool=torch")
        return
    if not steps:
        print(f"warning: {GP}.tool={tool} but {GP}.steps is empty: nothing is profiled; set e.g. {GP}.steps=[1]")
    elif tool == "torch" and not any(OmegaConf.select(config, f"{r}.profiler.enable") for r in PROFILED_ROLES):
        print(f"warning: {GP}.tool=torch but no role has profiler.enable=True: nothing is profiled; set "
              f"{ACTOR}.enable=True (and actor_rollout_ref.ref / critic / reward_model .profiler.enable as wanted)")
