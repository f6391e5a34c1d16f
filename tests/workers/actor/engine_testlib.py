"""Shared helpers for the training-engine tests (tiny Qwen2 models, synthetic PPO batches, gloo process groups).

Other engine test folders import this file after putting this folder on sys.path.
"""

from __future__ import annotations

import gc
import os
import socket
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VOCAB = 259  # the embedded tokenizer's vocabulary, so its files can sit beside the tiny model


def tiny_config(tie: bool = True, layers: int = 2):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=tie, rms_norm_eps=1e-6, use_sliding_window=False, pad_token_id=0,
                       bos_token_id=1, eos_token_id=2)


def tiny_model(seed: int = 0, tie: bool = True, layers: int = 2, attn: str = "sdpa"):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(tie, layers)
    cfg._attn_implementation = attn
    return Qwen2ForCausalLM(cfg).float()


def make_model_dir(path: str, seed: int = 0, tie: bool = True) -> str:
    """A tiny HF model directory (config, safetensors, tokenizer) at ``path``."""
    model = tiny_model(seed, tie)
    model.save_pretrained(path)
    try:
        from verl.utils.embedded import load_tokenizer

        load_tokenizer().save_pretrained(path)
    except Exception:  # tokenizer files are optional for the engine tests
        pass
    return path


def make_batch(bsz: int = 4, prompt_len: int = 6, resp_len: int = 5, seed: int = 0, with_ref: bool = True):
    """Left-padded prompts + right-padded responses with every field update_policy reads (fp32)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, VOCAB, (bsz, prompt_len), generator=g)
    responses = torch.randint(3, VOCAB, (bsz, resp_len), generator=g)
    p_mask = torch.ones(bsz, prompt_len, dtype=torch.long)
    r_mask = torch.ones(bsz, resp_len, dtype=torch.long)
    for i in range(bsz):
        p_valid = 1 + (i * 3 + seed) % prompt_len
        r_valid = 1 + (i * 2 + seed) % resp_len
        p_mask[i, : prompt_len - p_valid] = 0
        r_mask[i, r_valid:] = 0
    prompts = prompts * p_mask
    responses = responses * r_mask
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([p_mask, r_mask], dim=1)
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    batch = dict(prompts=prompts, responses=responses, input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids, response_mask=r_mask,
                 old_log_probs=-3.0 - torch.rand(bsz, resp_len, generator=g),
                 advantages=torch.randn(bsz, resp_len, generator=g),
                 returns=torch.randn(bsz, resp_len, generator=g),
                 values=0.1 * torch.randn(bsz, resp_len, generator=g))
    if with_ref:
        batch["ref_log_prob"] = -3.0 - torch.rand(bsz, resp_len, generator=g)
    return batch


class FullLogitsForward(torch.nn.Module):
    """A causal LM behind a forward that does not take ``logits_to_keep``: the LM head runs on every position (the
    reference the response-positions-only forward is compared with)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, fn, args, err_dir):
    # everything inherited from the parent stays uncollected here: a process group (or any object owning
    # threads) that the parent left for its garbage collector would be finalized in this child, whose copy has
    # no threads, and ProcessGroupGloo's destructor would wait forever to join them
    gc.freeze()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), HF_HUB_OFFLINE="1", VERL_DEVICE="cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    except BaseException:
        with open(os.path.join(err_dir, f"err_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.barrier()
        dist.destroy_process_group()


def run_distributed(fn, world_size: int, *args, err_dir: str = "/tmp"):
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` forked processes joined by a gloo group."""
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401  (imported once, inherited by the forks)

    gc.collect()  # objects earlier tests left for the collector are finalized here, where their threads exist
    try:
        # fork: children inherit the already-imported torch / transformers (a fresh interpreter per rank costs
        # 20+ s of imports on a busy 2-core machine)
        mp.start_processes(_entry, args=(world_size, free_port(), fn, args, err_dir), nprocs=world_size, join=True,
                           start_method="fork")
    except Exception as exc:
        msgs = []
        for r in range(world_size):
            p = os.path.join(err_dir, f"err_{r}.txt")
            if os.path.exists(p):
                msgs.append(open(p).read())
        raise AssertionError("distributed run failed:\n" + "\n".join(msgs)) from exc


def actor_config(**overrides):
    from omegaconf import OmegaConf

    cfg = dict(strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False,
               ppo_max_token_len_per_gpu=64, clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2,
               clip_ratio_c=3.0, loss_agg_mode="token-mean", entropy_coeff=0.0, use_kl_loss=False,
               kl_loss_coef=0.001, kl_loss_type="low_var_kl", ppo_epochs=1, shuffle=False, grad_clip=1.0,
               use_remove_padding=False, policy_loss={"loss_mode": "vanilla"},
               optim=dict(lr=1e-2, betas=[0.9, 0.999], weight_decay=0.01, clip_grad=1.0, lr_warmup_steps=-1,
                          lr_warmup_steps_ratio=0.0, lr_scheduler_type="constant", total_training_steps=10),
               fsdp_config=dict(param_offload=False, optimizer_offload=False, reshard_after_forward=True,
                                model_dtype="fp32", dtype="fp32", fsdp_size=-1))
    merged = OmegaConf.merge(OmegaConf.create(cfg), OmegaConf.create(overrides))
    return merged


def assert_adapter_checkpoint_round_trip(engine, fresh_engine, log_probs, out_dir, params, want_lp, mask, exported):
    """A LoRA engine's checkpoint, read by a fresh engine with other initial adapters, restores every parameter
    (``params``: name -> tensor after training) and the policy (``log_probs(actor)[mask] == want_lp``); the model
    merger then writes exactly the ``exported`` merged HF weights. Call last: the merger tears the model-parallel
    grid down."""
    from verl.model_merger.megatron_model_merger import load_megatron_checkpoint

    ckpt = os.path.join(out_dir, "global_step_2", "actor")
    engine.save_checkpoint(ckpt, global_step=2)
    other, other_actor = fresh_engine()
    other.load_checkpoint(ckpt)
    for name, p in other.module.named_parameters():
        assert torch.equal(p.detach(), params[name].detach()), name
    assert torch.equal(log_probs(other_actor)[mask], want_lp)
    state = load_megatron_checkpoint(ckpt, engine.hf_config, value_head=False)
    assert set(state) == set(exported), sorted(set(state) ^ set(exported))[:4]
    for name, tensor in exported.items():
        assert torch.allclose(state[name], tensor, atol=1e-7, rtol=0), name
