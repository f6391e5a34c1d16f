"""Hybrid-engine weight push: time of vLLMRollout.update_weights vs the time of a GRPO step, same model.

    .venv/bin/python benchmarks/weight_sync.py --size base --dtype float32

Push: the full HF state dict (~104M parameters for ``base``) streamed tensor by tensor into the in-process vLLM
engine (``collective_rpc("reload_weights")`` + prefix-cache reset), median of ``--reps``. This is what the
sharding manager does each step, minus the FSDP all-gather of each shard (none with one worker).

Step: the measured components of one GRPO step on the same model and machine, for the reference workload of 32
prompts x 4 samples x ``--tokens`` tokens: rollout generation (measured in full), the trainer's log-prob
forward and the actor update (forward + backward + AdamW), each measured on a micro-batch of ``--micro`` rows
and scaled to 128 rows. ``--step_s`` replaces the estimate with a step time you measured in a real run.
Prints both and the ratio; target: push <= 10% of a step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench_prompts import left_padded_prompts  # noqa: E402

from verl.protocol import DataProto  # noqa: E402

ROWS = 32 * 4


def make_prompts(tokenizer, count: int) -> DataProto:
    return left_padded_prompts(tokenizer, [f"{i % 97}+{(7 * i) % 89}=" for i in range(count)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="base", choices=["tiny", "small", "base"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, default=64, help="response tokens per sample in the reference step")
    parser.add_argument("--micro", type=int, default=16, help="rows per measured trainer micro-batch")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--step_s", type=float, default=None, help="a measured GRPO step time to compare against")
    parser.add_argument("--model_root", default=os.path.join(tempfile.gettempdir(), "verl_bench_models"))
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.utils.embedded import count_parameters, make_model_dir
    from verl.workers.rollout.utils import resolve_torch_dtype
    from verl.workers.rollout.vllm_rollout import vLLMRollout

    model_dir = make_model_dir(os.path.join(args.model_root, args.size), size=args.size)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    n_params = count_parameters(model)
    prompts = make_prompts(tokenizer, ROWS // 4)
    P = prompts.batch["input_ids"].shape[1]
    cfg = dict(n=4, temperature=1.0, do_sample=True, response_length=args.tokens, prompt_length=P,
               dtype=args.dtype, load_format="auto", ignore_eos=True, max_num_seqs=256,
               tensor_model_parallel_size=1, cpu_kv_cache_space_gb=1)
    rollout = vLLMRollout(config=cfg, model_path=model_dir, tokenizer=tokenizer)

    # --- the push (the actor's weights after an update: perturbed, so the engine really changes)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    rollout.update_weights(model.state_dict().items())  # warm-up
    push = []
    for _ in range(args.reps):
        start = time.perf_counter()
        rollout.update_weights(model.state_dict().items())
        push.append(time.perf_counter() - start)
    push_s = statistics.median(push)
    nbytes = rollout.last_update_stats.get("num_bytes", 0.0)

    # --- one GRPO step's measured components
    start = time.perf_counter()
    out = rollout.generate_sequences(prompts)
    gen_s = time.perf_counter() - start
    rollout.shutdown()
    if args.step_s is None:
        model.to(resolve_torch_dtype(args.dtype))
        micro = out[: args.micro]
        ids, mask, pos = (micro.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
        scale = ROWS / args.micro
        with torch.no_grad():
            start = time.perf_counter()
            model(input_ids=ids, attention_mask=mask, position_ids=pos)
            fwd_s = (time.perf_counter() - start) * scale
        optim = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
        start = time.perf_counter()
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        logits.float().log_softmax(-1)[:, -args.tokens - 1:-1].mean().backward()
        bwd_s = (time.perf_counter() - start) * scale
        start = time.perf_counter()
        optim.step()
        opt_s = time.perf_counter() - start
        step_s = gen_s + fwd_s + bwd_s + opt_s
        how = (f"estimate = gen {gen_s:.2f} + old_log_prob fwd {fwd_s:.2f} + update fwd/bwd {bwd_s:.2f} "
               f"+ AdamW {opt_s:.2f}")
    else:
        step_s = args.step_s
        how = "given with --step_s"

    print(f"# model {args.size}: {n_params / 1e6:.1f}M params, {args.dtype} engine, torch threads "
          f"{torch.get_num_threads()}; step = {ROWS} samples x {args.tokens} tokens")
    print(f"update_weights: {push_s:.3f} s (median of {args.reps}: {[round(t, 3) for t in push]}), "
          f"{nbytes / 1e6:.0f} MB streamed, {nbytes / 1e9 / push_s:.2f} GB/s")
    print(f"GRPO step: {step_s:.2f} s ({how})")
    print(f"push / step = {push_s / step_s:.3%}  (target <= 10%)")
    return push_s, step_s


if __name__ == "__main__":
    main()
