"""FSDP vs Megatron (TP=2) training engines: seconds per PPO optimizer step and peak RSS, on 2 CPU processes.

python benchmarks/engine_compare.py [--sizes tiny small] [--rows 16] [--prompt 64] [--response 64] [--steps 4]

Both engines run the same actor loss (``DataParallelPPOActor``) on the same synthetic batch from the same
embedded Qwen2 weights, fp32, gloo. FSDP shards over the 2 processes (data parallel 2, each process sees half
the rows); Megatron splits every layer over them (tensor parallel 2 with sequence parallel, each process sees
every row). The first step is a warm-up and is not timed. Printed: median step time, peak RSS of the busiest
process, and the ratios Megatron / FSDP.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.protocol import DataProto
from verl.utils.embedded import make_model_dir
from verl.utils.model import compute_position_id_with_mask
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.engine import get_engine_cls
from verl.workers.engine.config import EngineConfig


def _batch(rows: int, prompt: int, response: int, vocab: int = 259) -> DataProto:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": mask, "position_ids": compute_position_id_with_mask(mask),
        "responses": ids[:, prompt:], "response_mask": mask[:, prompt:],
        "old_log_probs": -5.0 - torch.rand(rows, response, generator=g),
        "advantages": torch.randn(rows, response, generator=g)})


def _actor_cfg(mini: int):
    from omegaconf import OmegaConf

    return OmegaConf.create(dict(ppo_mini_batch_size=mini, ppo_micro_batch_size_per_gpu=mini, ppo_epochs=1,
                                 clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0,
                                 use_kl_loss=False, policy_loss={"loss_mode": "vanilla"}))


def _worker(rank, world, port, model_dir, strategy, args, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), VERL_DEVICE="cpu")
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    megatron = {"tensor_model_parallel_size": 2} if strategy == "megatron" else {}
    cfg = EngineConfig(model_path=model_dir, name="actor", strategy=strategy, megatron=megatron,
                       optim={"lr": 1e-5}, grad_clip=1.0, total_training_steps=100)
    engine = get_engine_cls(strategy).build(cfg)
    data = _batch(args.rows, args.prompt, args.response)
    if engine.dp_size > 1:
        data = data.chunk(engine.dp_size)[rank]
    actor = DataParallelPPOActor(config=_actor_cfg(len(data)), engine=engine)
    times = []
    for step in range(args.steps + 1):
        dist.barrier()
        start = time.perf_counter()
        actor.update_policy(data)
        dist.barrier()
        if step:
            times.append(time.perf_counter() - start)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put((statistics.median(times), float(rss.item())))
    dist.barrier()
    dist.destroy_process_group()


def _run(model_dir: str, strategy: str, args) -> tuple[float, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(_worker, args=(2, port, model_dir, strategy, args, out), nprocs=2, join=True,
                       start_method="spawn")
    return out.get()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--rows", type=int, default=16, help="sequences per step (whole batch, both processes)")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="timed steps (after one warm-up)")
    args = parser.parse_args(argv)
    print(f"{'size':<6} {'engine':<12} {'s/step':>8} {'peak RSS MiB':>13}")
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = make_model_dir(os.path.join(tmp, size), size=size)
            fsdp = _run(model_dir, "fsdp", args)
            mcore = _run(model_dir, "megatron", args)
        print(f"{size:<6} {'fsdp':<12} {fsdp[0]:>8.3f} {fsdp[1]:>13.0f}")
        print(f"{size:<6} {'megatron tp2':<12} {mcore[0]:>8.3f} {mcore[1]:>13.0f}")
        print(f"{size:<6} {'ratio m/f':<12} {mcore[0] / fsdp[0]:>8.2f} {mcore[1] / fsdp[1]:>13.2f}")


if __name__ == "__main__":
    main()
