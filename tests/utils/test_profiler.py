"""verl.utils.profiler: the timers under verl's names, DistProfiler's per-call torch traces (where they land, what
is in them, which ranks and roles write them), the worker-group methods, named ranges and the memory lines."""

import gzip
import json
import logging
import time

import pytest
import torch
from omegaconf import OmegaConf

from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch
from verl.utils.profiler import (DistProfiler, DistProfilerExtension, GPUMemoryLogger, Profiler, ProfilerConfig,
                                 log_gpu_memory_usage, mark_annotate, mark_end_range, mark_start_range, marked_timer,
                                 simple_timer)
from verl.utils.profiler.config import TorchMemoryToolConfig
from verl.utils.profiler.performance import reduce_timing


def trace_events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def names(path):
    return {e.get("name") for e in trace_events(path)}


# ------------------------------------------------------------------------------------------------ timers

def test_timers_accumulate_under_verls_names():
    timing = {}
    with simple_timer("gen", timing):
        time.sleep(0.01)
    with marked_timer("gen", timing, color="red", domain="verl", category="rollout"):
        time.sleep(0.01)
    with pytest.raises(RuntimeError):
        with marked_timer("update_actor", timing):
            raise RuntimeError("the time until the error still counts")
    assert set(timing) == {"gen", "update_actor"}
    assert timing["gen"] >= 0.02 and timing["update_actor"] >= 0


def test_debug_module_keeps_the_old_names():
    import verl.utils.debug as debug
    from verl.utils.debug.performance import reduce_timing as old_reduce, simple_timer as old_timer

    assert debug.GPUMemoryLogger is GPUMemoryLogger and debug.marked_timer is marked_timer
    assert old_timer is simple_timer and old_reduce is reduce_timing
    assert reduce_timing({"gen": 1.5}) == {"gen": 1.5}  # no process group: unchanged


# ------------------------------------------------------------------------------------------ DistProfiler

class FakeWorker(DistProfilerExtension):
    """A role with an annotated training call (forward + backward of a small layer)."""

    def __init__(self, rank, profiler_cfg):
        DistProfilerExtension.__init__(self, DistProfiler(rank, profiler_cfg))
        self.layer = torch.nn.Linear(16, 16)

    @DistProfiler.annotate(color="red", role="actor_update")
    def update_actor(self, x):
        loss = self.layer(x).pow(2).mean()
        loss.backward()
        return loss.item()

    @DistProfiler.annotate(role="actor_compute_log_prob")
    def compute_log_prob(self, x):
        with torch.no_grad():
            return self.layer(x).sum().item()


def role_cfg(tmp_path, **kw):
    node = {"tool": "torch", "enable": True, "all_ranks": False, "ranks": [], "save_path": str(tmp_path),
            "tool_config": {"torch": {"step_start": 0, "step_end": None},
                            "torch_memory": {"trace_alloc_max_entries": 100, "stack_depth": 32}}}
    node.update(kw)
    return OmegaConf.create(node)


def test_torch_traces_per_step_and_role(tmp_path, capsys):
    worker = FakeWorker(0, role_cfg(tmp_path))
    x = torch.randn(4, 16)
    worker.update_actor(x)  # before start_profile: not recorded
    worker.start_profile(role="e2e", profile_step=3)
    worker.update_actor(x)
    worker.update_actor(x)
    worker.compute_log_prob(x)
    worker.stop_profile()
    worker.update_actor(x)  # after stop_profile: not recorded
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json.gz"))
    assert files == ["3/actor_compute_log_prob/prof_rank-0.pt.trace.json.gz",
                     "3/actor_update/prof_rank-0-call2.pt.trace.json.gz",
                     "3/actor_update/prof_rank-0.pt.trace.json.gz"]
    update = names(tmp_path / "3/actor_update/prof_rank-0.pt.trace.json.gz")
    assert "update_actor" in update  # the call's own named range
    assert any(n and n.startswith("aten::") for n in update)  # forward ops
    assert any(n and "Backward" in n for n in update)  # backward ops
    log_prob = names(tmp_path / "3/actor_compute_log_prob/prof_rank-0.pt.trace.json.gz")
    assert "aten::addmm" in log_prob and not any(n and "Backward" in n for n in log_prob)  # forward only
    assert "trace of actor_update (step 3) ->" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, rank", [
    ({"enable": False}, 0),  # the role is not profiled
    ({"ranks": [1]}, 0),  # another rank is
    ({}, 1),  # default: rank 0 only
    ({"tool": None}, 0),  # profiling off
])
def test_unselected_roles_and_ranks_write_nothing(tmp_path, overrides, rank):
    worker = FakeWorker(rank, role_cfg(tmp_path, **overrides))
    worker.start_profile(profile_step=1)
    assert worker.update_actor(torch.randn(2, 16)) > 0  # the call itself runs as usual
    worker.stop_profile()
    assert list(tmp_path.rglob("*.json.gz")) == []


def test_all_ranks_and_listed_ranks(tmp_path):
    for rank in (0, 1, 2):
        worker = FakeWorker(rank, role_cfg(tmp_path, ranks=[1, 2]))
        worker.start_profile(profile_step=1)
        worker.compute_log_prob(torch.randn(2, 16))
        worker.stop_profile()
    assert sorted(p.name for p in tmp_path.rglob("*.json.gz")) == ["prof_rank-1.pt.trace.json.gz",
                                                                  "prof_rank-2.pt.trace.json.gz"]
    assert ProfilerConfig(all_ranks=True).selects(7) and not ProfilerConfig(ranks=[1]).selects(0)


def test_a_nested_call_is_a_range_in_the_outer_trace(tmp_path):
    class Nested(FakeWorker):
        @DistProfiler.annotate(role="outer")
        def outer(self, x):
            return self.compute_log_prob(x)

    worker = Nested(0, role_cfg(tmp_path))
    worker.start_profile(profile_step=2)
    worker.outer(torch.randn(2, 16))
    worker.compute_log_prob(torch.randn(2, 16))  # its first trace of its own: no "-call2"
    worker.stop_profile()
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json.gz"))
    assert files == ["2/actor_compute_log_prob/prof_rank-0.pt.trace.json.gz", "2/outer/prof_rank-0.pt.trace.json.gz"]
    assert {"outer", "compute_log_prob"} <= names(tmp_path / files[1])


def test_start_stop_profile_are_group_methods_on_every_rank():
    for name in ("start_profile", "stop_profile"):
        attrs = getattr(getattr(DistProfilerExtension, name), MAGIC_ATTR)
        assert attrs["dispatch_mode"] == Dispatch.ONE_TO_ALL


def test_tools_that_are_not_available_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="tool=nsys: Nsight Systems profiling is not available here; use tool=torch"):
        DistProfiler(0, role_cfg(tmp_path, tool="nsys"))
    DistProfiler(0, role_cfg(tmp_path, tool="npu", enable=False))  # off: nothing to refuse
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="tool=torch_memory records the CUDA memory allocator and needs a CUDA"):
            DistProfiler(0, role_cfg(tmp_path, tool="torch_memory"))
    with pytest.raises(ValueError, match="not one of"):
        ProfilerConfig(tool="perf")


def test_profiler_config_reads_a_role_section(tmp_path):
    cfg = ProfilerConfig.from_config(role_cfg(tmp_path, tool="torch_memory", all_ranks=True))
    assert cfg.tool == "torch_memory" and cfg.all_ranks and cfg.save_path == str(tmp_path)
    assert cfg.tool_config == TorchMemoryToolConfig(trace_alloc_max_entries=100, stack_depth=32)
    assert ProfilerConfig.from_config(None) == ProfilerConfig()
    a, b = ProfilerConfig(tool="torch", enable=True, ranks=[0, 1]), ProfilerConfig(tool="torch", ranks=[1, 2])
    assert a.union(b).ranks == [0, 1, 2] and a.union(b).enable
    assert a.intersect(b).ranks == [1] and not a.intersect(b).enable


def test_plain_profiler_writes_one_trace(tmp_path):
    prof = Profiler(ProfilerConfig(tool="torch", enable=True, save_path=str(tmp_path)), save_file_prefix="update")
    prof.start()
    assert prof.check()
    torch.randn(8, 8).matmul(torch.randn(8, 8))
    prof.step()
    prof.stop()
    assert prof.saved == str(tmp_path / "update_prof_rank-0.pt.trace.json.gz") and "aten::matmul" in names(prof.saved)
    off = Profiler(ProfilerConfig(tool="torch", enable=False, save_path=str(tmp_path / "off")))
    off.start()
    off.stop()
    assert not off.check() and off.saved is None


def test_named_ranges_show_in_a_trace(tmp_path):
    @mark_annotate(message="score_batch")
    def score():
        return torch.ones(3).sum()

    prof = Profiler(ProfilerConfig(tool="torch", enable=True, save_path=str(tmp_path)))
    prof.start()
    handle = mark_start_range(message="reward")
    score()
    mark_end_range(handle)
    with marked_timer("old_log_prob", {}):
        pass
    prof.stop()
    assert {"reward", "score_batch", "old_log_prob"} <= names(prof.saved)


# ---------------------------------------------------------------------------------------- memory lines

def test_memory_lines(capsys, caplog):
    log_gpu_memory_usage("after init")
    assert capsys.readouterr().out.startswith("after init, process memory (GB): ")

    @GPUMemoryLogger(role="actor", logger=logging.getLogger("mem"), level=logging.INFO)
    def update(x):
        return x + 1

    with caplog.at_level(logging.INFO, logger="mem"):
        assert update(1) == 2
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("[actor] before update, ") and lines[1].startswith("[actor] after update, ")
