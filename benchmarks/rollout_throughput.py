"""Rollout throughput: vLLMRollout.generate_sequences vs bare vllm.LLM.generate vs the HF rollout.

    .venv/bin/python benchmarks/rollout_throughput.py --sizes tiny small --prompts 64 --n 4 --tokens 64

All three run in this one process on the same prompts and sampling settings (temperature 1, every response
forced to ``--tokens`` tokens with ignore_eos so each engine does identical work). The bare-vLLM number uses the
*same* engine the rollout wraps, so the ratio isolates our wrapper's cost (prompt unpadding, DataProto
assembly, logprob extraction). Prints generated tokens/s (median of ``--reps`` timed runs after a warm-up) and
the ratios; target: ours >= 0.9 x bare vLLM. Ours and bare runs alternate, and ``ours/bare`` is the median of
the per-pair ratios, so that load from other processes on a shared machine hits both sides alike. The HF
rollout runs once (it is slow).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench_prompts import left_padded_prompts  # noqa: E402

from verl.protocol import DataProto  # noqa: E402


def make_prompts(tokenizer, count: int, seed: int = 0) -> DataProto:
    rng = random.Random(seed)
    return left_padded_prompts(tokenizer, [f"{rng.randint(0, 99)}{rng.choice('+-*')}{rng.randint(0, 99)}="
                                           for _ in range(count)])


def bench_size(size: str, args, root: str) -> dict:
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from verl.utils.embedded import make_model_dir
    from verl.workers.rollout.hf_rollout import HFRollout
    from verl.workers.rollout.vllm_rollout import vLLMRollout

    model_dir = make_model_dir(os.path.join(root, size), size=size)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = make_prompts(tokenizer, args.prompts)
    cfg = dict(n=args.n, temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, response_length=args.tokens,
               prompt_length=prompts.batch["input_ids"].shape[1], dtype=args.dtype, load_format="auto",
               ignore_eos=True, max_num_seqs=256, tensor_model_parallel_size=1,
               cpu_kv_cache_space_gb=args.kv_cache_gb)
    rollout = vLLMRollout(config=cfg, model_path=model_dir, tokenizer=tokenizer)
    expected_tokens = args.prompts * args.n * args.tokens

    token_lists = [row[m.bool()].tolist() for row, m in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"])]
    sp = SamplingParams(n=args.n, temperature=1.0, top_p=1.0, max_tokens=args.tokens, ignore_eos=True, logprobs=0)
    bare_prompts = [{"prompt_token_ids": ids} for ids in token_lists]

    def ours():
        out = rollout.generate_sequences(prompts)
        return int(out.batch["attention_mask"][:, -args.tokens:].sum())

    def bare():
        return sum(len(c.token_ids) for r in rollout.llm.generate(bare_prompts, sp, use_tqdm=False) for c in r.outputs)

    ours()  # warm-up
    bare()
    # interleaved (alternating order) so that load from other processes hits both sides alike
    ours_s, bare_s, ratios = [], [], []
    for rep in range(args.reps):
        pair = {}
        for name, fn in ((("ours", ours), ("bare", bare)) if rep % 2 == 0 else (("bare", bare), ("ours", ours))):
            start = time.perf_counter()
            tokens = fn()
            pair[name] = (time.perf_counter() - start, tokens)
        assert pair["ours"][1] == pair["bare"][1] == expected_tokens, pair
        ours_s.append(pair["ours"][0])
        bare_s.append(pair["bare"][0])
        ratios.append(pair["bare"][0] / pair["ours"][0])
    result = dict(size=size, ours_tok_s=expected_tokens / statistics.median(ours_s),
                  bare_tok_s=expected_tokens / statistics.median(bare_s), ratio=statistics.median(ratios),
                  tokens=expected_tokens, engine_init_s=rollout.init_seconds)
    rollout.shutdown()
    if not args.skip_hf:
        hf = HFRollout(dict(cfg, name="hf"), model_dir, tokenizer=tokenizer)
        start = time.perf_counter()
        hf_out = hf.generate_sequences(prompts)
        hf_s = time.perf_counter() - start
        result.update(hf_tok_s=int(hf_out.batch["attention_mask"][:, -args.tokens:].sum()) / hf_s)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny"], choices=["tiny", "small", "base"])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kv_cache_gb", type=float, default=1.0)
    parser.add_argument("--skip_hf", action="store_true", help="leave out the (slow) HF rollout")
    parser.add_argument("--model_root", default=os.path.join(tempfile.gettempdir(), "verl_bench_models"))
    args = parser.parse_args(argv)

    print(f"# {args.prompts} prompts x {args.n} samples x {args.tokens} tokens, {args.dtype}, "
          f"torch threads={torch.get_num_threads()}, median of {args.reps}")
    rows = [bench_size(size, args, args.model_root) for size in args.sizes]
    print(f"{'size':6} {'ours tok/s':>11} {'bare vLLM tok/s':>16} {'HF tok/s':>9} {'ours/bare':>10} {'ours/HF':>8}")
    for r in rows:
        hf = r.get("hf_tok_s")
        hf_col = f"{hf:9.0f}" if hf else f"{'-':>9}"
        vs_hf = f"{r['ours_tok_s'] / hf:8.2f}" if hf else f"{'-':>8}"
        print(f"{r['size']:6} {r['ours_tok_s']:11.0f} {r['bare_tok_s']:16.0f} {hf_col} "
              f"{r['ratio']:10.3f} {vs_hf}")
    return rows


if __name__ == "__main__":
    main()
