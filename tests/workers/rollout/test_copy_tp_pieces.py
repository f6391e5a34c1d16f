"""``copy_tp_pieces``: a tensor rank's HF-named pieces land in the rows a tensor-parallel vLLM engine of the same
size holds on that rank (fused q/k/v and gate/up, vocabulary shards with zeroed padding), checked on a small
module tree with vLLM's attribute names (no vLLM needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from verl.models.mcore.convert import Shapes, local_hf_pieces, shard
from verl.workers.rollout.vllm_rollout.direct_load import copy_tp_pieces

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER, VOCAB, ENGINE_VOCAB = 4, 2, 8, 32, 24, 259, 320
SENTINEL = -7.0
PREFIX = "model.layers.0."


class FakeQKV(nn.Module):
    def __init__(self, tp: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_size = HEADS // tp, KV_HEADS // tp, HEAD_DIM
        rows = (self.num_heads + 2 * self.num_kv_heads) * HEAD_DIM
        self.weight = nn.Parameter(torch.full((rows, HIDDEN), SENTINEL))
        self.bias = nn.Parameter(torch.full((rows,), SENTINEL))


class FakeLinear(nn.Module):
    def __init__(self, rows: int, cols: int):
        super().__init__()
        self.weight = nn.Parameter(torch.full((rows, cols), SENTINEL))


class FakeVocabShard(nn.Module):
    """vLLM's VocabParallelEmbedding / ParallelLMHead: this rank's rows, padded; marked by ``shard_indices``."""

    def __init__(self, rows: int):
        super().__init__()
        self.weight = nn.Parameter(torch.full((rows, HIDDEN), SENTINEL))
        self.shard_indices = object()


class FakeNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.full((HIDDEN,), SENTINEL))


def fake_engine(tp: int) -> nn.Module:
    """One tensor rank of a one-layer Llama-shaped engine, with vLLM's module names."""
    attn = nn.Module()
    attn.qkv_proj = FakeQKV(tp)
    attn.o_proj = FakeLinear(HIDDEN, HEADS * HEAD_DIM // tp)
    mlp = nn.Module()
    mlp.gate_up_proj = FakeLinear(2 * INTER // tp, HIDDEN)
    layer = nn.Module()
    layer.self_attn, layer.mlp = attn, mlp
    inner = nn.Module()
    inner.layers = nn.ModuleList([layer])
    inner.embed_tokens = FakeVocabShard(ENGINE_VOCAB // tp)
    inner.norm = FakeNorm()
    root = nn.Module()
    root.model = inner
    root.lm_head = FakeVocabShard(ENGINE_VOCAB // tp)
    return root


def hf_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    return {
        "q_proj.weight": rnd(HEADS * HEAD_DIM, HIDDEN), "k_proj.weight": rnd(KV_HEADS * HEAD_DIM, HIDDEN),
        "v_proj.weight": rnd(KV_HEADS * HEAD_DIM, HIDDEN), "q_proj.bias": rnd(HEADS * HEAD_DIM),
        "k_proj.bias": rnd(KV_HEADS * HEAD_DIM), "v_proj.bias": rnd(KV_HEADS * HEAD_DIM),
        "o_proj.weight": rnd(HIDDEN, HEADS * HEAD_DIM), "gate_proj.weight": rnd(INTER, HIDDEN),
        "up_proj.weight": rnd(INTER, HIDDEN), "embed_tokens.weight": rnd(VOCAB, HIDDEN),
        "lm_head.weight": rnd(VOCAB, HIDDEN), "norm.weight": rnd(HIDDEN),
    }


def vllm_vocab_range(rank: int, tp: int) -> tuple[int, int]:
    rows = ENGINE_VOCAB // tp
    return rank * rows, min((rank + 1) * rows, VOCAB)


def rank_pieces(full: dict, rank: int, tp: int) -> list[tuple[str, torch.Tensor]]:
    """The HF-named pieces of one tensor rank, cut by hand the way a tensor-parallel engine cuts them."""
    a, b = vllm_vocab_range(rank, tp)
    pieces = [(f"{PREFIX}self_attn.{p}_proj.{leaf}", full[f"{p}_proj.{leaf}"].chunk(tp)[rank])
              for leaf in ("weight", "bias") for p in "qkv"]
    pieces += [(f"{PREFIX}self_attn.o_proj.weight", full["o_proj.weight"].chunk(tp, dim=1)[rank]),
               (f"{PREFIX}mlp.gate_proj.weight", full["gate_proj.weight"].chunk(tp)[rank]),
               (f"{PREFIX}mlp.up_proj.weight", full["up_proj.weight"].chunk(tp)[rank]),
               ("model.embed_tokens.weight", full["embed_tokens.weight"][a:b]),
               ("lm_head.weight", full["lm_head.weight"][a:b]),
               ("model.norm.weight", full["norm.weight"])]
    return pieces


ALL_WRITTEN = {f"{PREFIX}self_attn.qkv_proj.weight", f"{PREFIX}self_attn.qkv_proj.bias",
               f"{PREFIX}self_attn.o_proj.weight", f"{PREFIX}mlp.gate_up_proj.weight", "model.embed_tokens.weight",
               "lm_head.weight", "model.norm.weight"}


@pytest.mark.parametrize("tp", [1, 2])
def test_every_piece_lands_in_its_rows(tp):
    full = hf_weights()
    for rank in range(tp):
        engine = fake_engine(tp)
        written = copy_tp_pieces(engine, (item for item in rank_pieces(full, rank, tp)))  # any iterable
        assert written == ALL_WRITTEN
        p = dict(engine.named_parameters())
        q_rows, kv_rows = HEADS * HEAD_DIM // tp, KV_HEADS * HEAD_DIM // tp
        for leaf in ("weight", "bias"):
            fused = p[f"{PREFIX}self_attn.qkv_proj.{leaf}"]
            assert torch.equal(fused[:q_rows], full[f"q_proj.{leaf}"].chunk(tp)[rank])
            assert torch.equal(fused[q_rows:q_rows + kv_rows], full[f"k_proj.{leaf}"].chunk(tp)[rank])
            assert torch.equal(fused[q_rows + kv_rows:], full[f"v_proj.{leaf}"].chunk(tp)[rank])
        gate_up = p[f"{PREFIX}mlp.gate_up_proj.weight"]
        half = INTER // tp
        assert torch.equal(gate_up[:half], full["gate_proj.weight"].chunk(tp)[rank])
        assert torch.equal(gate_up[half:], full["up_proj.weight"].chunk(tp)[rank])
        assert torch.equal(p[f"{PREFIX}self_attn.o_proj.weight"], full["o_proj.weight"].chunk(tp, dim=1)[rank])
        assert torch.equal(p["model.norm.weight"], full["norm.weight"])
        a, b = vllm_vocab_range(rank, tp)
        for name, hf_name in (("model.embed_tokens.weight", "embed_tokens.weight"),
                              ("lm_head.weight", "lm_head.weight")):
            shard_rows = p[name]
            assert shard_rows.shape == (ENGINE_VOCAB // tp, HIDDEN)
            assert torch.equal(shard_rows[:b - a], full[hf_name][a:b])
            if rank == tp - 1:
                assert b - a == VOCAB - (tp - 1) * ENGINE_VOCAB // tp < shard_rows.shape[0]  # the last has padding
            assert torch.count_nonzero(shard_rows[b - a:]) == 0  # the sentinel was overwritten with zeros
        assert all((t != SENTINEL).all() for t in p.values())  # nothing left unwritten


def test_pieces_from_a_megatron_rank_fill_the_engine_like_the_hf_cut():
    """Megatron's fused local shards, cut back into HF pieces, give the engine the same fused rows as the HF cut."""
    tp = 2
    full = hf_weights(seed=3)
    shapes = Shapes(num_query_groups=KV_HEADS, head_dim=HEAD_DIM, vocab_size=VOCAB, padded_vocab=384)
    for rank in range(tp):
        expected, engine = fake_engine(tp), fake_engine(tp)
        copy_tp_pieces(expected, rank_pieces(full, rank, tp))
        pieces = []
        for leaf in ("weight", "bias"):
            local = shard("qkv", [full[f"{p}_proj.{leaf}"] for p in "qkv"], rank, tp, shapes)
            q, k, v = local_hf_pieces("qkv", local, shapes, tp)
            pieces += [(f"{PREFIX}self_attn.{p}_proj.{leaf}", t) for p, t in zip("qkv", (q, k, v))]
        gate, up = local_hf_pieces("fc1", shard("fc1", [full["gate_proj.weight"], full["up_proj.weight"]], rank, tp,
                                                shapes), shapes, tp)
        pieces += [(f"{PREFIX}mlp.gate_proj.weight", gate), (f"{PREFIX}mlp.up_proj.weight", up)]
        written = copy_tp_pieces(engine, pieces)
        assert written == {f"{PREFIX}self_attn.qkv_proj.weight", f"{PREFIX}self_attn.qkv_proj.bias",
                           f"{PREFIX}mlp.gate_up_proj.weight"}
        got, want = dict(engine.named_parameters()), dict(expected.named_parameters())
        for name in written:
            assert torch.equal(got[name], want[name]), name


def test_a_partial_stream_writes_only_its_parameters():
    full = hf_weights()
    engine = fake_engine(2)
    pieces = [(n, t) for n, t in rank_pieces(full, 1, 2) if n.endswith("k_proj.weight") or n == "model.norm.weight"]
    assert copy_tp_pieces(engine, pieces) == {f"{PREFIX}self_attn.qkv_proj.weight", "model.norm.weight"}
    p = dict(engine.named_parameters())
    fused = p[f"{PREFIX}self_attn.qkv_proj.weight"]
    assert (fused[:16] == SENTINEL).all() and (fused[24:] == SENTINEL).all()  # q and v rows untouched
    assert torch.equal(fused[16:24], full["k_proj.weight"].chunk(2)[1])
    assert (p["model.embed_tokens.weight"] == SENTINEL).all()
    assert (p[f"{PREFIX}self_attn.qkv_proj.bias"] == SENTINEL).all()
    assert copy_tp_pieces(engine, []) == set()


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.rotary_emb.weight", "model.layers.0.mlp.down_proj.weight",
                                  "model.final_norm.weight"])
def test_a_weight_the_engine_lacks_is_named(name):
    with pytest.raises(RuntimeError) as info:
        copy_tp_pieces(fake_engine(2), [(name, torch.zeros(HIDDEN))])
    assert name in str(info.value) and "no parameter" in str(info.value)


@pytest.mark.parametrize("name, shape, fits", [
    (f"{PREFIX}self_attn.o_proj.weight", (HIDDEN, 17), "slice (32, 16)"),  # columns of another TP size
    (f"{PREFIX}self_attn.q_proj.weight", (16, HIDDEN - 1), "slice (16, 32)"),
    (f"{PREFIX}mlp.up_proj.weight", (12, HIDDEN + 1), "slice (12, 32)"),
    ("model.norm.weight", (HIDDEN * 2,), "slice (32,)"),
    ("model.embed_tokens.weight", (161, HIDDEN), "vocabulary shard (160, 32)"),  # more rows than the shard
    ("lm_head.weight", (99, HIDDEN - 2), "vocabulary shard (160, 32)"),  # hidden size differs
])
def test_a_piece_of_the_wrong_shape_is_named(name, shape, fits):
    engine = fake_engine(2)
    before = {n: t.detach().clone() for n, t in engine.named_parameters()}
    with pytest.raises(RuntimeError) as info:
        copy_tp_pieces(engine, [(name, torch.ones(shape))])
    message = str(info.value)
    assert name in message and str(tuple(shape)) in message and fits in message
    assert all(torch.equal(t, before[n]) for n, t in engine.named_parameters())  # nothing written
