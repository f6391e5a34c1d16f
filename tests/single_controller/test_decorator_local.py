"""The backend-neutral layer without Ray: @register, Dispatch modes, binding onto a WorkerGroup.

``LocalWorkerGroup`` below is a complete (if synchronous) backend: worker instances in this process.
"""

import os
import pickle
import subprocess
import sys

import pytest
import torch

from verl.protocol import DataProto
from verl.single_controller.base import ResourcePool, Worker, WorkerGroup
from verl.single_controller.base.decorator import (
    MAGIC_ATTR,
    Dispatch,
    Execute,
    collect_all_to_all,
    dispatch_one_to_all,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)


class LocalWorkerGroup(WorkerGroup):
    def __init__(self, cls, world_size):
        super().__init__(ResourcePool([world_size]))
        self._workers = []
        for rank in range(world_size):
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
            self._workers.append(cls())
        self.method_names = self._bind_worker_method(cls)

    def execute_all_async(self, method_name, *args, **kwargs):
        n = len(self._workers)
        if (args or kwargs) and all(isinstance(a, list) and len(a) == n for a in (*args, *kwargs.values())):
            return [getattr(w, method_name)(*(a[i] for a in args), **{k: v[i] for k, v in kwargs.items()})
                    for i, w in enumerate(self._workers)]
        return [getattr(w, method_name)(*args, **kwargs) for w in self._workers]

    def execute_rank_zero_async(self, method_name, *args, **kwargs):
        return getattr(self._workers[0], method_name)(*args, **kwargs)

    def _wait_outputs(self, output, method_name):
        return output


def _sum_dispatch(worker_group, x):
    return ([x * (r + 1) for r in range(worker_group.world_size)],), {}


def _sum_collect(worker_group, output):
    return sum(output)


register_dispatch_mode("TEST_SCALED_SUM", _sum_dispatch, _sum_collect)


class W(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def tag(self, data):
        return DataProto.from_dict({"y": data.batch["x"] * 10 + self.rank})

    @register(dispatch_mode=Dispatch.TEST_SCALED_SUM)
    def scaled(self, x):
        return x

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_zero(self, x):
        return (self.rank, x)

    def not_registered(self):
        return "hidden"


@pytest.fixture()
def group(monkeypatch):
    monkeypatch.delenv("VERL_NUM_THREADS", raising=False)
    return LocalWorkerGroup(W, 2)


def test_binding_and_builtin_dispatch(group):
    assert {"tag", "scaled", "only_zero", "_query_dispatch_info"} <= set(group.method_names)
    assert not hasattr(group, "not_registered")
    out = group.tag(DataProto.from_dict({"x": torch.arange(4.0)}))
    assert out.batch["y"].tolist() == [0.0, 10.0, 21.0, 31.0]
    assert group.only_zero("a") == (0, "a")  # ONE_TO_ALL + Execute.RANK_ZERO: rank 0 gets the plain value
    with pytest.raises(ValueError, match=r"tag\(\): batch of length 3 .* data-parallel size 2"):
        group.tag(DataProto.from_dict({"x": torch.arange(3.0)}))


def test_custom_dispatch_mode_register_and_update(group):
    assert group.scaled(3) == 3 + 6
    update_dispatch_mode("TEST_SCALED_SUM", dispatch_one_to_all, collect_all_to_all)
    try:
        assert LocalWorkerGroup(W, 2).scaled(3) == [3, 3]
    finally:
        update_dispatch_mode(Dispatch.TEST_SCALED_SUM, _sum_dispatch, _sum_collect)
    with pytest.raises(ValueError, match="already exists"):
        register_dispatch_mode("TEST_SCALED_SUM", _sum_dispatch, _sum_collect)
    with pytest.raises(ValueError, match="unknown dispatch mode"):
        update_dispatch_mode("NOPE", _sum_dispatch, _sum_collect)


def test_dispatch_enum_pickles_and_register_validates():
    assert pickle.loads(pickle.dumps(Dispatch.DP_COMPUTE_PROTO)) is Dispatch.DP_COMPUTE_PROTO
    assert getattr(W.tag, MAGIC_ATTR)["dispatch_mode"] is Dispatch.DP_COMPUTE_PROTO
    assert Dispatch.DP_COMPUTE_METRIC in Dispatch and Execute.RANK_ZERO in Execute
    with pytest.raises(ValueError, match="dispatch_mode='nope'"):
        register(dispatch_mode="nope")
    with pytest.raises(AttributeError, match="no member 'MISSING'"):
        Dispatch.MISSING  # noqa: B018


def test_worker_reads_env_and_sets_threads(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29555")
    monkeypatch.setenv("VERL_NUM_THREADS", "1")
    before = torch.get_num_threads()
    try:
        w = W()
        assert (w.rank, w.world_size, w.local_rank, w.local_world_size) == (3, 4, 1, 2)
        assert w.get_master_addr_port() == ("10.0.0.1", "29555")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    w._register_dispatch_collect_info("dp", dp_rank=1, is_collect=False)
    assert w._query_dispatch_info("dp") == 1 and w._query_collect_info("dp") is False
    with pytest.raises(ValueError, match="already registered"):
        w._register_dispatch_collect_info("dp", dp_rank=0, is_collect=True)
    with pytest.raises(ValueError, match="never declared"):
        w._query_dispatch_info("other")


def test_base_package_does_not_import_ray():
    code = "import sys, verl.single_controller.base, verl.single_controller.base.decorator; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("share,cores,procs,expected", [
    (1.998, 2, 1, 2),   # a lone worker on 2 cores: the 0.999 fit-trim must not cost a thread
    (0.999, 2, 2, 1),   # two workers on 2 cores: one each
    (4.0, 2, 1, 2),     # never more threads than real cores
    (0.25, 8, 4, 1),    # a fractional share still gets one thread
    (3.996, 8, 2, 4),   # 4 CPUs less the fit-trim
    (2.5, 8, 2, 2),
])
def test_thread_share_counts_whole_cpus(share, cores, procs, expected):
    from verl.single_controller.ray.resource import RayResourcePool

    pool = RayResourcePool([procs], use_gpu=False, num_cpus_per_process=share)
    assert pool.thread_share(cores, procs) == expected
