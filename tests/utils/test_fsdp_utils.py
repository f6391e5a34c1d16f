"""Engine helpers: model loading (causal LM, value model from an actor checkpoint, clear errors), optimizer and
schedules, grad clipping, remove-padding helpers, FSDP2 wrapping + full-weight streaming."""

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "workers", "actor"))
from engine_testlib import make_batch, make_model_dir, run_distributed, tiny_model  # noqa: E402

from verl.utils.fsdp_utils import build_lr_scheduler, build_optimizer, clip_grad_norm_  # noqa: E402
from verl.utils.model import check_model_dir, load_causal_lm, load_reward_model, load_value_model  # noqa: E402
from verl.utils.padding import pack_batch, pad_input, unpad_input  # noqa: E402
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(str(tmp_path_factory.mktemp("tiny")), seed=0)


def test_load_models_and_override(model_dir):
    lm = load_causal_lm(model_dir, dtype="bf16", override_config={"rms_norm_eps": 1e-5})
    assert lm.config.rms_norm_eps == 1e-5 and next(lm.parameters()).dtype == torch.bfloat16
    critic = load_value_model(model_dir, dtype="fp32")
    assert critic.config.num_labels == 1
    assert torch.count_nonzero(critic.score.weight) == 0  # head absent from the actor checkpoint: zero init
    ref = tiny_model(seed=0)
    assert torch.equal(critic.model.layers[0].mlp.up_proj.weight, ref.model.layers[0].mlp.up_proj.weight)
    ids = torch.randint(3, 200, (2, 5))
    assert torch.equal(critic(input_ids=ids).logits, torch.zeros(2, 5, 1))
    rm = load_reward_model(model_dir)
    assert rm(input_ids=ids).logits.shape == (2, 1)


def test_lora_value_model_streams_base_names(model_dir):
    from verl.utils.fsdp_utils import apply_lora, iter_full_state_dict

    critic = load_value_model(model_dir)
    base_names = set(critic.state_dict())
    wrapped = apply_lora(critic, lora_rank=2, lora_alpha=4)
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert any("score" in n for n in trainable)  # the value head trains with the adapters
    assert {n for n, _ in iter_full_state_dict(wrapped)} == base_names


def test_missing_model_dir_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_causal_lm(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        check_model_dir(str(tmp_path))


def test_optimizer_and_schedules():
    p = torch.nn.Parameter(torch.ones(3))
    opt = build_optimizer([p], FSDPOptimizerConfig(lr=0.1, betas=[0.8, 0.9], weight_decay=0.0))
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["betas"] == (0.8, 0.9)
    sched = build_lr_scheduler(opt, FSDPOptimizerConfig(lr_warmup_steps_ratio=0.2, lr_scheduler_type="constant"),
                               total_steps=10)
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.0, 0.05, 0.1, 0.1])
    opt = build_optimizer([p], FSDPOptimizerConfig(lr=1.0))
    sched = build_lr_scheduler(opt, FSDPOptimizerConfig(lr_warmup_steps=2, warmup_style="cosine", min_lr_ratio=0.1), 12)
    lrs = []
    for _ in range(13):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[2] == pytest.approx(1.0) and lrs[12] == pytest.approx(0.1) and lrs[7] == pytest.approx(0.55)
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        build_lr_scheduler(opt, FSDPOptimizerConfig(lr_scheduler_type="linear"), 10)


def test_clip_grad_norm_plain():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    assert clip_grad_norm_([a, b], 1.0) == pytest.approx(5.0)
    assert torch.allclose(torch.cat([a.grad, b.grad]), torch.tensor([0.6, 0.0, 0.8]), atol=1e-6)
    a.grad = torch.tensor([float("inf"), 0.0])
    assert not math.isfinite(clip_grad_norm_([a, b], 1.0))


def test_unpad_pad_roundtrip():
    b = make_batch(5, 6, 4, seed=2)
    ids, mask = b["input_ids"], b["attention_mask"]
    flat, indices, cu, max_len = unpad_input(ids.unsqueeze(-1), mask)
    assert flat.shape[0] == int(mask.sum()) and cu[-1] == int(mask.sum()) and max_len == int(mask.sum(-1).max())
    assert torch.equal(pad_input(flat, indices, 5, 10).squeeze(-1), ids * mask)
    packed_ids, packed_pos, _, cu2 = pack_batch(ids, mask, b["position_ids"])
    _, rebuilt_pos, _, _ = pack_batch(ids, mask, None)
    assert torch.equal(packed_pos, rebuilt_pos)  # 0..L-1 per sequence
    assert torch.equal(cu, cu2) and packed_ids.shape == (1, int(mask.sum()))


def test_packed_forward_has_no_cross_sequence_attention():
    """transformers builds the block-diagonal mask from packed position_ids (attention_mask=None)."""
    model = tiny_model(seed=3)
    a, b = torch.randint(3, 200, (1, 5)), torch.randint(3, 200, (1, 4))
    packed = torch.cat([a, b], 1)
    pos = torch.cat([torch.arange(5), torch.arange(4)]).unsqueeze(0)
    with torch.no_grad():
        out = model(input_ids=packed, position_ids=pos, attention_mask=None, use_cache=False).logits
        sep = torch.cat([model(input_ids=a).logits, model(input_ids=b).logits], 1)
    assert (out - sep).abs().max() < 1e-5


HSDP_IDS = torch.arange(3, 15).reshape(2, 6)


def _fsdp_worker(rank, world, out_dir):
    from verl.utils.fsdp_utils import (apply_fsdp2, fsdp_version, get_full_state_dict, iter_full_state_dict,
                                       load_full_state_dict)

    model = tiny_model(seed=0)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    apply_fsdp2(model, FSDPEngineConfig(dtype="bf16", reshard_after_forward=True, param_offload=True,
                                        offload_policy=True))
    assert fsdp_version(model) == 2
    local = model.model.embed_tokens.weight.to_local()
    assert local.shape[0] in (129, 130)  # 259 rows over 2 ranks
    ids = torch.randint(3, 200, (2, 6))
    logits = model(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16  # mixed precision: bf16 compute over fp32 storage
    assert model.model.embed_tokens.weight.dtype == torch.float32
    logits.float().sum().backward()
    g = clip_grad_norm_(model.parameters(), 1.0)
    names = [n for n, _ in iter_full_state_dict(model)]
    assert names == list(ref) and "lm_head.weight" in names
    new = {k: v + 1.0 for k, v in ref.items()}
    load_full_state_dict(model, new)
    got = get_full_state_dict(model)
    if rank == 0:
        torch.save({"got": got, "new": new, "grad_norm": g}, f"{out_dir}/fsdp_utils.pt")

    # HSDP (fsdp_size=1: replicate over 2 ranks, shard over 1): checkpoint shards merge back to full weights
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import create_device_mesh

    hsdp = tiny_model(seed=4)
    apply_fsdp2(hsdp, FSDPEngineConfig(dtype="fp32"), create_device_mesh(world, fsdp_size=1))
    assert hsdp.model.embed_tokens.weight.device_mesh.mesh_dim_names == ("ddp", "fsdp")
    FSDPCheckpointManager(hsdp, None, None, None).save_checkpoint(local_path=f"{out_dir}/hsdp", global_step=1)
    hsdp(input_ids=HSDP_IDS).logits.sum().backward()  # same data on both replicas: averaged grads = local grads
    hsdp_norm = clip_grad_norm_(hsdp.parameters(), None)
    if rank == 0:
        torch.save(hsdp_norm, f"{out_dir}/hsdp_norm.pt")

    # fsdp_config.forward_prefetch: each layer prefetches the next one's all-gather (same outputs);
    # mixed_precision.buffer_dtype: the floating-point buffers (rotary frequencies) in that dtype
    plain, prefetched = tiny_model(seed=5), tiny_model(seed=5)
    apply_fsdp2(plain, FSDPEngineConfig(dtype="fp32"))
    apply_fsdp2(prefetched, FSDPEngineConfig(dtype="fp32", forward_prefetch=True,
                                             mixed_precision={"buffer_dtype": "bf16"}))
    layers = list(prefetched.model.layers)
    assert [s._states_to_forward_prefetch for s in (l._get_fsdp_state() for l in layers)] == \
        [[nxt._get_fsdp_state()] for nxt in layers[1:]] + [[]]
    assert all(l._get_fsdp_state()._states_to_forward_prefetch == [] for l in plain.model.layers)
    buffers = [b for b in prefetched.buffers() if b.is_floating_point()]
    assert buffers and all(b.dtype == torch.bfloat16 for b in buffers)
    assert all(b.dtype == torch.float32 for b in plain.buffers() if b.is_floating_point())
    prefetched.model.rotary_emb.inv_freq.data = plain.model.rotary_emb.inv_freq.data.clone()
    assert torch.equal(plain(input_ids=HSDP_IDS).logits, prefetched(input_ids=HSDP_IDS).logits)


@pytest.mark.e2e
def test_fsdp2_wrap_mixed_precision_and_state_dict_roundtrip(tmp_path):
    run_distributed(_fsdp_worker, 2, str(tmp_path), err_dir=str(tmp_path))
    res = torch.load(tmp_path / "fsdp_utils.pt", weights_only=False)
    assert res["grad_norm"] > 0 and math.isfinite(res["grad_norm"])
    for k, v in res["new"].items():
        assert torch.equal(res["got"][k], v), k
    from verl.model_merger.fsdp_model_merger import load_fsdp_checkpoint

    plain = tiny_model(seed=4)
    plain(input_ids=HSDP_IDS).logits.sum().backward()
    expect = clip_grad_norm_(plain.parameters(), None)
    assert abs(torch.load(tmp_path / "hsdp_norm.pt") - expect) < 1e-4 * expect
    merged = load_fsdp_checkpoint(str(tmp_path / "hsdp"))
    for k, v in tiny_model(seed=4).state_dict().items():
        assert torch.equal(merged[k], v), k


def test_lr_schedules_come_from_transformers_and_keep_verl_numbers():
    """build_lr_scheduler uses transformers' schedules; the lr per step equals verl's formula (warm-up, cosine to
    min_lr_ratio) computed by hand."""
    import math

    from verl.utils.fsdp_utils import build_lr_scheduler

    def lrs(optim_cfg, total, steps):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        sched = build_lr_scheduler(opt, optim_cfg, total)
        out = []
        for _ in range(steps):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out, type(sched).__module__

    total, warmup, min_ratio = 40, 4, 0.1
    got, _ = lrs(FSDPOptimizerConfig(lr_scheduler_type="cosine", lr_warmup_steps=warmup, min_lr_ratio=min_ratio),
                  total, total)
    for step, lr in enumerate(got):
        if step < warmup:
            factor = step / warmup
        else:
            progress = (step - warmup) / (total - warmup)
            factor = min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        assert lr == pytest.approx(0.5 * factor, rel=1e-12, abs=1e-15), step
    const, _ = lrs(FSDPOptimizerConfig(lr_scheduler_type="constant", lr_warmup_steps_ratio=0.25), 8, 8)
    assert const == pytest.approx([0.0, 0.25, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="lr_scheduler_type=cosine needs the total"):
        lrs(FSDPOptimizerConfig(lr_scheduler_type="cosine"), None, 1)


def _foreach_worker(rank, world, out_dir):
    from verl.utils.fsdp_utils import apply_fsdp2

    torch.manual_seed(0)
    ids = torch.randint(3, 200, (4, 6))
    results = {}
    for name, override in (("auto", None), ("loop", {"foreach": False})):
        model = apply_fsdp2(tiny_model(seed=0), FSDPEngineConfig(dtype="fp32"))
        opt = build_optimizer(model.parameters(), FSDPOptimizerConfig(lr=1e-2, override_optimizer_config=override))
        results[f"{name}_foreach"] = opt.defaults.get("foreach")
        for _ in range(3):
            model(input_ids=ids).logits.float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        results[name] = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    plain = tiny_model(seed=0)
    results["plain_foreach"] = build_optimizer(plain.parameters(), FSDPOptimizerConfig(lr=1e-2)).defaults.get("foreach")
    torch.save(results, f"{out_dir}/foreach.pt")


@pytest.mark.e2e
def test_fsdp2_params_on_cpu_get_the_foreach_adamw_with_the_same_update(tmp_path):
    """DTensor parameters on CPU: ``foreach`` unless the user chose (override_optimizer_config), and 3 AdamW steps
    give the same weights as torch's per-parameter loop; plain tensors keep torch's own choice."""
    run_distributed(_foreach_worker, 1, str(tmp_path), err_dir=str(tmp_path))
    res = torch.load(tmp_path / "foreach.pt", weights_only=False)
    assert res["auto_foreach"] is True and res["loop_foreach"] is False and res["plain_foreach"] is None
    for k, v in res["loop"].items():
        assert torch.allclose(res["auto"][k], v, rtol=1e-6, atol=1e-7), k
    assert any(not torch.equal(res["auto"][k], tiny_model(seed=0).state_dict()[k]) for k in res["auto"])


def _one_rank_full_worker(rank, world, out_dir):
    from verl.utils.fsdp_utils import _full, apply_fsdp2, iter_full_state_dict

    model = tiny_model(seed=1)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    apply_fsdp2(model, FSDPEngineConfig(dtype="fp32"))
    weight = model.model.embed_tokens.weight
    # one rank: the local shard is the whole tensor, returned as is (no collective, no copy)
    assert _full(weight).data_ptr() == weight.to_local().data_ptr()
    got = {n: t.clone() for n, t in iter_full_state_dict(model)}
    torch.save({"got": got, "ref": ref}, f"{out_dir}/one_rank.pt")


def test_full_weights_of_a_one_rank_fsdp2_model_skip_the_gather(tmp_path):
    run_distributed(_one_rank_full_worker, 1, str(tmp_path), err_dir=str(tmp_path))
    res = torch.load(tmp_path / "one_rank.pt", weights_only=False)
    assert list(res["got"]) == list(res["ref"])
    for k, v in res["ref"].items():
        assert torch.equal(res["got"][k], v), k


def _bucket_gather_worker(rank, world, out_dir):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from verl.utils.fsdp_utils import _full_in_buckets

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(0)  # same values on every rank
    shapes = [(4, 3), (1, 5), (259, 16), (7,), (2, 2, 3), (5, 4)]
    dtypes = [torch.float32, torch.float32, torch.bfloat16, torch.float32, torch.float32, torch.float32]
    items = []
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        items.append((f"s{i}", distribute_tensor(torch.randn(shape, generator=gen).to(dtype), mesh, [Shard(0)])))
    items.insert(3, ("rep", distribute_tensor(torch.randn(3, 3, generator=gen), mesh, [Replicate()])))
    items.insert(5, ("plain", torch.randn(2, generator=gen)))
    expect = [(n, t.full_tensor() if hasattr(t, "full_tensor") else t) for n, t in items]
    for bucket_bytes in (1 << 30, 64, 0):  # one collective for all / a new bucket for almost every / every tensor
        got = list(_full_in_buckets(items, bucket_bytes))
        assert [n for n, _ in got] == [n for n, _ in expect]
        for (name, a), (_, b) in zip(got, expect):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (name, bucket_bytes)
            assert not hasattr(a, "full_tensor"), name  # plain tensors out
    open(f"{out_dir}/ok_{rank}", "w").close()


@pytest.mark.e2e
def test_full_weights_are_gathered_in_buckets_equal_to_full_tensor(tmp_path):
    """Three ranks: uneven row splits (4 rows -> 2, 2, 0), a one-row tensor, bf16 next to fp32 (separate buckets),
    1-D and 3-D tensors, replicated and plain tensors in between (they end the bucket before them)."""
    run_distributed(_bucket_gather_worker, 3, str(tmp_path), err_dir=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["ok_0", "ok_1", "ok_2"]


def test_a_saved_lora_adapter_loads_trainable_with_its_weights(tmp_path, model_dir):
    """model.lora_adapter_path: the adapter saved by a PEFT run comes back on the base model with the same adapter
    weights, only those trainable."""
    from verl.utils.fsdp_utils import apply_lora, load_lora_adapter
    from verl.utils.model import load_causal_lm

    trained = apply_lora(load_causal_lm(model_dir), 4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_()  # a trained adapter: B is no longer zero
    trained.save_pretrained(str(tmp_path / "adapter"))
    loaded = load_lora_adapter(load_causal_lm(model_dir), str(tmp_path / "adapter"))
    want = {n: p for n, p in trained.named_parameters() if "lora_" in n}
    got = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
    assert want.keys() == got.keys() and all(torch.equal(got[n], want[n]) for n in want)
    assert {n for n, p in loaded.named_parameters() if p.requires_grad} == set(got)
