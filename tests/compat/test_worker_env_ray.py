"""Per-worker environment variables passed through a worker group (``RayWorkerGroup(..., worker_env=...)``)
reach every worker before its constructor runs, next to the group's own RANK / WORLD_SIZE; the group's own
variables cannot be overridden; ``master_addr`` / ``master_port`` (both or neither) fix the rendezvous."""

from __future__ import annotations

import compat_workers
import pytest
import ray  # a hard requirement: a broken install must fail here, not skip

from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

pytestmark = [pytest.mark.e2e, pytest.mark.own_ray]  # starts Ray in this process


@pytest.fixture(scope="module")
def local_ray():
    from verl.utils.ray_utils import init_local_ray

    ray.cloudpickle.register_pickle_by_value(compat_workers)
    init_local_ray(num_cpus=2, namespace="verl_compat_tests")
    yield
    ray.shutdown()


def test_worker_env_reaches_every_worker_before_init(local_ray):
    pool = RayResourcePool([2])
    try:
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(compat_workers.EnvWorker),
                            worker_env={"COMPAT_FLAG": "on", "COMPAT_NUMBER": 7},
                            master_addr="127.0.0.1", master_port=29517)
        seen = wg.read_env(["COMPAT_FLAG", "COMPAT_NUMBER", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
        assert seen == [{"COMPAT_FLAG": "on", "COMPAT_NUMBER": "7", "RANK": str(r), "WORLD_SIZE": "2",
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "at_init": "on"} for r in range(2)]
        assert (wg.master_address, wg.master_port) == ("127.0.0.1", "29517")
        # roles spawned from a group share its workers and so its environment
        assert wg.customized_worker_env == {"COMPAT_FLAG": "on", "COMPAT_NUMBER": "7"}
    finally:
        pool.remove()


def test_protected_variables_are_refused_before_any_worker_starts(local_ray):
    pool = RayResourcePool([1])
    with pytest.raises(ValueError, match=r"Cannot override protected system env: \['MASTER_PORT', 'RANK'\]"):
        RayWorkerGroup(pool, RayClassWithInitArgs(compat_workers.EnvWorker),
                       worker_env={"RANK": "3", "MASTER_PORT": "1", "OK": "1"})
    assert pool.pgs is None  # nothing was reserved or started
    with pytest.raises(ValueError, match="Both 'master_addr' and 'master_port'"):
        RayWorkerGroup(pool, RayClassWithInitArgs(compat_workers.EnvWorker), master_port=1234)
    assert pool.pgs is None
    with pytest.raises(TypeError, match="worker_env must be a dict"):
        RayWorkerGroup(pool, RayClassWithInitArgs(compat_workers.EnvWorker), worker_env=["A=1"])
