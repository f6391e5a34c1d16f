"""Training-engine speed: our FSDP actor per variant vs a bare padded PyTorch loop, on one device.

    python benchmarks/gpu_engine_mfu.py                       # the GPU workload below (needs CUDA)
    python benchmarks/gpu_engine_mfu.py --shape cpu-small     # the same batch shape scaled down, runs on a CPU
    python benchmarks/gpu_engine_mfu.py --variants bare ours-pack ours-pack-fused --repeats 3

Workload (``--shape qwen2.5-1.5b``): a Qwen2.5-1.5B-shaped model with random weights, 64 rows of prompts of
64-512 and responses of 64-1024 tokens (seeded; about half the padded batch is real tokens), left-padded prompts
and right-padded responses, micro-batch 8, AdamW. Mixed precision: fp32 master weights, bf16 compute (on a CPU
without native bf16, fp32). Each variant times one old-log-prob pass (``compute_log_prob``) and one PPO update
(``update_policy``, one mini-batch) after a warm-up of both, in a fresh process (so its peak memory is its own);
variants alternate, ``--repeats`` rounds, median [min, max].

Variants:
  bare                 a hand-written padded loop (autocast, gradient checkpointing), the baseline;
  bare-nockpt          the same loop without gradient checkpointing (the like-for-like peer of ours-pack*);
  ours-default         our actor with verl's defaults on this device (remove padding, gradient checkpointing);
  ours-pack            packed rows with the variable-length attention kernel, no checkpointing;
  ours-pack-ckpt       the same with gradient checkpointing;
  ours-pack-fused      packed rows + the chunked output layer (use_fused_kernels), no checkpointing;
  ours-pack-fused-compile   the same with the decoder layers compiled (use_torch_compile).
  ours-trim            padded batch minus all-padding columns (the CPU default), no checkpointing.

MFU counts the matmul FLOPs of the real tokens only (6 x parameters x tokens for an update, 2 x for a forward
pass, plus attention over each sequence), against ``--peak-tflops`` (989: an H100's dense bf16). Peak memory:
the device allocator's peak on CUDA, the process's peak RSS on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_utils import REPO, host_dtype, median_range  # noqa: E402

SHAPES = {
    # hidden, intermediate, layers, heads, kv heads, vocab, rows, prompt (min, max), response (min, max), micro
    "qwen2.5-1.5b": dict(hidden=1536, inter=8960, layers=28, heads=12, kv=2, vocab=151936, rows=64,
                         prompt=(64, 512), response=(64, 1024), micro=8),
    "cpu-small": dict(hidden=576, inter=1536, layers=8, heads=9, kv=3, vocab=49152, rows=16,
                      prompt=(16, 128), response=(16, 256), micro=4),
    "cpu-tiny": dict(hidden=128, inter=352, layers=2, heads=4, kv=2, vocab=4096, rows=8,
                     prompt=(4, 32), response=(4, 64), micro=4),
}
VARIANTS = {
    "bare": dict(bare=True, ckpt=True),
    "bare-nockpt": dict(bare=True),
    "ours-default": dict(remove_padding=True, ckpt=True),
    "ours-trim": dict(remove_padding=True, mode="trim"),
    "ours-pack": dict(remove_padding=True, mode="pack"),
    "ours-pack-ckpt": dict(remove_padding=True, mode="pack", ckpt=True),
    "ours-pack-fused": dict(remove_padding=True, mode="pack", fused=True),
    "ours-pack-fused-compile": dict(remove_padding=True, mode="pack", fused=True, compile=True),
}

ONE_RUN = r'''
import json, os, resource, sys, time
spec = json.loads(sys.argv[1])
if spec["variant"].get("mode"):
    os.environ["VERL_REMOVE_PADDING_MODE"] = spec["variant"]["mode"]
import torch
import torch.distributed as dist
from transformers import Qwen2ForCausalLM

shape, variant, dtype = spec["shape"], spec["variant"], spec["dtype"]
cuda = torch.cuda.is_available()
device = torch.device("cuda" if cuda else "cpu")
half = torch.bfloat16 if dtype == "bf16" else torch.float32
torch.manual_seed(0)
model_dir = spec["model_dir"]
g = torch.Generator().manual_seed(1)
rows, (pmin, pmax), (rmin, rmax) = shape["rows"], shape["prompt"], shape["response"]
plen = torch.randint(pmin, pmax + 1, (rows,), generator=g)
rlen = torch.randint(rmin, rmax + 1, (rows,), generator=g)
ids = torch.randint(3, shape["vocab"], (rows, pmax + rmax), generator=g)
mask = torch.zeros(rows, pmax + rmax, dtype=torch.long)
for i in range(rows):
    mask[i, pmax - plen[i]: pmax + rlen[i]] = 1
ids = ids * mask
position_ids = torch.clip(torch.cumsum(mask, -1) - 1, min=0)
real = int(mask.sum())
batch = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids, responses=ids[:, pmax:],
             response_mask=mask[:, pmax:], old_log_probs=-2.0 - torch.rand(rows, rmax, generator=g),
             advantages=torch.randn(rows, rmax, generator=g))

def peak_gb():
    if cuda:
        return torch.cuda.max_memory_allocated() / 1024**3
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2

def sync():
    if cuda:
        torch.cuda.synchronize()

micro = shape["micro"]
if variant.get("bare"):  # the bare padded loop
    model = Qwen2ForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32).to(device)
    if variant.get("ckpt"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    b = {k: v.to(device) for k, v in batch.items()}
    def logp(rows_slice, grad):
        out = model(input_ids=b["input_ids"][rows_slice], attention_mask=b["attention_mask"][rows_slice],
                    position_ids=b["position_ids"][rows_slice]).logits[:, pmax - 1:-1].float()
        return torch.log_softmax(out, -1).gather(-1, b["responses"][rows_slice].unsqueeze(-1)).squeeze(-1)
    def old_pass():
        model.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=half, enabled=half != torch.float32):
            return torch.cat([logp(slice(i, i + micro), False) for i in range(0, rows, micro)])
    def update():
        model.train()
        opt.zero_grad(set_to_none=True)
        tokens = b["response_mask"].sum()
        for i in range(0, rows, micro):
            s = slice(i, i + micro)
            with torch.autocast(device.type, dtype=half, enabled=half != torch.float32):
                lp = logp(s, True)
            ratio = torch.exp(lp - b["old_log_probs"][s])
            adv = b["advantages"][s]
            loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            ((loss * b["response_mask"][s]).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
else:
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    from verl.workers.engine import get_engine_cls
    from verl.workers.engine.config import EngineConfig
    from verl.utils.chunked_head import DEFAULT_CHUNK_SIZE
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(spec["port"]))
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    fsdp = {"mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32"}} if half == torch.bfloat16 else {}
    fsdp["reshard_after_forward"] = False
    engine = get_engine_cls("fsdp").build(EngineConfig(
        model_path=model_dir, name="actor", use_remove_padding=variant.get("remove_padding", False),
        enable_gradient_checkpointing=variant.get("ckpt", False), fsdp=fsdp, optim={"lr": 1e-6},
        grad_clip=1.0, total_training_steps=100, use_torch_compile=variant.get("compile", False),
        fused_chunk_size=DEFAULT_CHUNK_SIZE if variant.get("fused") else 0))
    actor = DataParallelPPOActor(config=OmegaConf.create(dict(
        ppo_mini_batch_size=rows, ppo_micro_batch_size_per_gpu=micro, log_prob_micro_batch_size_per_gpu=micro,
        ppo_epochs=1, clip_ratio=0.2, loss_agg_mode="token-mean", entropy_coeff=0.0, use_kl_loss=False,
        policy_loss={"loss_mode": "vanilla"})), engine=engine)
    data = DataProto.from_dict(batch)
    def old_pass():
        return actor.compute_log_prob(data)
    def update():
        return actor.update_policy(data)

old_pass(); update(); sync()  # warm-up (allocator, kernels, compilation)
if cuda:
    torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter(); old_pass(); sync(); t1 = time.perf_counter(); update(); sync(); t2 = time.perf_counter()
print(json.dumps({"old_log_prob_s": t1 - t0, "update_s": t2 - t1, "peak_gb": peak_gb(), "real_tokens": real,
                  "padded_tokens": int(mask.numel()),
                  "seq_sq": int(((plen + rlen) ** 2).sum()), "device": device.type}))
'''


MAKE_MODEL = r'''
import json, sys
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
shape, model_dir = json.loads(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["inter"],
                  num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                  num_key_value_heads=shape["kv"], max_position_embeddings=4096, tie_word_embeddings=True)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init on the GPU: seconds, not minutes
    model = Qwen2ForCausalLM(cfg)
model.save_pretrained(model_dir)
'''


def make_model(shape: str, model_dir: str) -> None:
    """One set of random weights (fp32, safetensors) that every variant and round loads, so all start equal."""
    subprocess.run([sys.executable, "-c", MAKE_MODEL, json.dumps(SHAPES[shape]), model_dir], check=True, cwd=REPO)


def flops(shape: dict, tokens: int, seq_sq: int, backward: bool) -> float:
    """Matmul FLOPs of ``tokens`` real tokens: the layers' weights, the output layer, and causal attention over
    each sequence (``seq_sq`` = sum of squared lengths), x3 with backward."""
    h, i, layers, heads, kv, vocab = (shape[k] for k in ("hidden", "inter", "layers", "heads", "kv", "vocab"))
    head_dim = h // heads
    per_layer = h * h * 2 + 2 * h * kv * head_dim + 3 * h * i  # q, o, k, v, gate/up/down
    dense = 2 * tokens * (layers * per_layer + h * vocab)
    attention = 2 * 2 * layers * h * seq_sq / 2  # QK^T and PV, causal half
    return (dense + attention) * (3 if backward else 1)


def run_one(shape: str, variant: str, dtype: str, port: int, model_dir: str) -> dict:
    spec = {"shape": SHAPES[shape], "variant": VARIANTS[variant], "dtype": dtype, "port": port,
            "model_dir": model_dir}
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", ONE_RUN, json.dumps(spec)], capture_output=True, text=True,
                         cwd=REPO, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--variants", nargs="+", default=["bare", "ours-default", "ours-pack", "ours-pack-fused"],
                        choices=sorted(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"),
                        help="compute dtype (auto: bf16 on CUDA or a CPU with native bf16, else fp32)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="device peak for MFU (default: 989 on CUDA, none on CPU)")
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    dtype = "bf16" if args.dtype == "auto" and cuda else host_dtype(args.dtype)
    peak = args.peak_tflops or (989.0 if cuda else None)
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mfu_model_") as model_dir:
        make_model(args.shape, model_dir)
        for r in range(args.repeats):
            for i, variant in enumerate(args.variants):
                if variant in failed:
                    continue
                try:
                    results[variant].append(run_one(args.shape, variant, dtype, 29500 + 17 * r + i, model_dir))
                except RuntimeError as err:  # one variant's failure (say, a kernel this device lacks) is reported
                    failed[variant] = str(err)
                    print(f"round {r} {variant}: FAILED\n{err}", flush=True)
                    continue
                print(f"round {r} {variant}: {results[variant][-1]}", flush=True)
    for variant in failed:
        results.pop(variant)
    if not results:
        raise SystemExit("every variant failed")
    shape = SHAPES[args.shape]
    first = next(iter(results.values()))[0]
    print(f"\n{args.shape}, {dtype}, {shape['rows']} rows, {first['real_tokens']} real of {first['padded_tokens']} "
          f"padded tokens, micro-batch {shape['micro']}, on {first['device']}; median [min, max] of {args.repeats}")
    base = results.get("bare") or results.get("bare-nockpt")
    header = f"{'variant':<26}{'old log-prob s':>22}{'update s':>22}{'update MFU':>12}{'peak GB':>10}{'vs bare':>9}"
    print(header)
    for variant in failed:
        print(f"{variant:<26}failed (see its error above)")
    for variant, runs in results.items():
        old = median_range(x["old_log_prob_s"] for x in runs)
        upd = median_range(x["update_s"] for x in runs)
        mem = median_range(x["peak_gb"] for x in runs)
        mfu = "n/a"
        if peak:
            mfu = f"{flops(shape, first['real_tokens'], first['seq_sq'], True) / upd[0] / (peak * 1e12):.0%}"
        ratio = f"{median_range(x['update_s'] for x in base)[0] / upd[0]:.2f}x" if base else "-"
        print(f"{variant:<26}{old[0]:>8.3f} [{old[1]:.3f},{old[2]:.3f}]{upd[0]:>8.3f} [{upd[1]:.3f},{upd[2]:.3f}]"
              f"{mfu:>12}{mem[0]:>10.2f}{ratio:>9}")


if __name__ == "__main__":
    main()
