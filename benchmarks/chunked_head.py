"""The chunked output layer (``model.use_fused_kernels=True``) vs the full-logits path on CPU: one log-prob
forward + backward of the engine's forward (``forward_log_probs`` with entropy, as an actor update runs it).

    .venv/bin/python benchmarks/chunked_head.py [--rows 8] [--seq 256] [--repeats 3] [--dtype auto]

Model: SmolLM2-135M's shape (Llama, 30 layers, hidden 576, 49,152-word vocabulary, tied embeddings) with random
weights (no download), sdpa attention, no gradient checkpointing. Each measurement runs in a fresh process (so
its peak RSS is its own), alternating full / chunked ``--repeats`` times; prints seconds and peak RSS, median
[min, max], and the chunked / full ratio. ``--dtype auto``: bf16 on a CPU with native bf16, fp32 otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_utils import REPO, host_dtype, median_range  # noqa: E402

ONE_RUN = textwrap.dedent('''
    import json, resource, sys, time, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.workers.engine.hf_forward import forward_log_probs
    chunk, rows, seq, dtype = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                      tie_word_embeddings=True, rms_norm_eps=1e-5)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    g = torch.Generator().manual_seed(1)
    prompt, response = seq // 2, seq - seq // 2
    ids = torch.randint(0, cfg.vocab_size, (rows, seq), generator=g)
    micro = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                 position_ids=torch.arange(seq).expand(rows, seq), responses=ids[:, prompt:])
    def step():
        model.zero_grad(set_to_none=True)
        entropy, log_probs = forward_log_probs(model, micro, 1.0, True, False, True, chunk)
        (log_probs.mean() + 0.01 * entropy.mean()).backward()
    step()  # warm-up (allocator, kernels)
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds,
                      "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2}))
''')


def run(chunk: int, args) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE_RUN, str(chunk), str(args.rows), str(args.seq), args.dtype],
                         capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"))
    args = parser.parse_args(argv)
    args.dtype = host_dtype(args.dtype)
    results: dict[str, list[dict]] = {"full": [], "chunked": []}
    for i in range(args.repeats):
        for name, chunk in (("full", 0), ("chunked", args.chunk)):
            results[name].append(run(chunk, args))
            print(f"run {i} {name}: {results[name][-1]}", flush=True)
    print(f"\nSmolLM2-135M shape, {args.dtype}, {args.rows} rows x {args.seq} tokens (log-probs of the last "
          f"{args.seq - args.seq // 2}), forward + backward, chunk {args.chunk}; median [min, max] of {args.repeats}")
    for key in ("seconds", "peak_rss_gb"):
        cells = {name: median_range(r[key] for r in runs) for name, runs in results.items()}
        full, chunked = cells["full"], cells["chunked"]
        print(f"{key:12s} full logits (baseline) {full[0]:.3f} [{full[1]:.3f}, {full[2]:.3f}]   chunked "
              f"{chunked[0]:.3f} [{chunked[1]:.3f}, {chunked[2]:.3f}]   chunked/full {chunked[0] / full[0]:.2f}")


if __name__ == "__main__":
    main()
