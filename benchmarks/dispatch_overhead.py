"""Overhead of a worker-group DP_COMPUTE_PROTO call vs the same work written by hand with Ray actors.

Baseline (named): two plain ``@ray.remote`` actors; the driver chunks the DataProto, calls each actor
with its chunk, ``ray.get``s both answers and concatenates them (what a user would write without verl).
Ours: a 2-worker ``RayWorkerGroup`` whose method is registered with ``Dispatch.DP_COMPUTE_PROTO``.
Both run the same identity-ish compute (``x + 1``, a same-size output). Measurements alternate between
the two so that machine load affects both alike; the script prints both medians and the ratio
(target: <= 1.5x).

    .venv/bin/python benchmarks/dispatch_overhead.py [--mb 10] [--iters 30] [--workers 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import ray
import torch

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils.ray_utils import init_local_ray


def plus_one(data: DataProto) -> DataProto:
    return DataProto.from_dict({"x": data.batch["x"] + 1.0})


class BenchWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute(self, data: DataProto) -> DataProto:
        return plus_one(data)


class PlainActor:
    def compute(self, data: DataProto) -> DataProto:
        return plus_one(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=10.0, help="payload size in MB (float32 tensor)")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (and hand-written actors)")
    args = parser.parse_args()

    rows, cols = 1024, max(1, int(args.mb * 1e6 / 4 / 1024))
    data = DataProto.from_dict({"x": torch.randn(rows, cols)})
    size_mb = data.batch["x"].numel() * 4 / 1e6

    n = args.workers
    init_local_ray(num_cpus=max(2, n))
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = RayResourcePool([n], use_gpu=False)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(BenchWorker))
    actors = [ray.remote(num_cpus=0)(PlainActor).remote() for _ in range(n)]

    def ours():
        return wg.compute(data)

    def baseline():
        refs = [a.compute.remote(c) for a, c in zip(actors, data.chunk(n))]
        return DataProto.concat(ray.get(refs))

    expected = data.batch["x"] + 1.0
    for fn in (ours, baseline):
        assert torch.equal(fn().batch["x"], expected), fn.__name__
        for _ in range(args.warmup):
            fn()

    times = {"ours": [], "baseline": []}
    for _ in range(args.iters):
        for name, fn in (("ours", ours), ("baseline", baseline)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)

    med_ours = statistics.median(times["ours"]) * 1e3
    med_base = statistics.median(times["baseline"]) * 1e3
    print(f"payload: DataProto {rows}x{cols} float32 = {size_mb:.1f} MB, {n} worker(s), {args.iters} iterations")
    print(f"baseline (hand-written Ray actors: chunk + {n} call(s) + ray.get + concat): median {med_base:.2f} ms")
    print(f"ours (RayWorkerGroup DP_COMPUTE_PROTO call):                            median {med_ours:.2f} ms")
    print(f"ratio ours/baseline: {med_ours / med_base:.2f}x (target <= 1.5x)")
    pool.remove()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
