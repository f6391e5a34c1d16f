"""The rollout layout (N workers in engines of t consecutive ranks), the driver's check of the engine
tensor-parallel size, the Megatron -> engine piece cuts (``local_hf_pieces``, ``range_overlaps``), the
host-aware default of ``rollout.tensor_model_parallel_size`` and the validator's use of all of them."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.trainer.validator_assets import write_validator_assets
from verl.models.mcore.convert import Shapes, local_hf_pieces, padded_vocab_size, range_overlaps, shard, unshard
from verl.trainer import host_defaults
from verl.trainer.config_schema import validate_ppo_config
from verl.trainer.host_defaults import resolve_host_defaults
from verl.utils.config import ConfigError
from verl.workers.rollout.layout import RolloutLayout, check_rollout_parallel, model_head_counts, rollout_layout

KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
CONFIG_DIR = str(Path(__file__).resolve().parents[3] / "verl" / "trainer" / "config")


# ---------------------------------------------------------------------------------------------- layout arithmetic


def test_four_workers_in_engines_of_two():
    layouts = [rollout_layout(4, rank, 2) for rank in range(4)]
    assert [lay.dp for lay in layouts] == [2, 2, 2, 2]
    assert [lay.dp_rank for lay in layouts] == [0, 0, 1, 1]
    assert [lay.tp_rank for lay in layouts] == [0, 1, 0, 1]
    assert [lay.is_collect for lay in layouts] == [True, False, True, False]
    assert [lay.group_ranks for lay in layouts] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all(lay.all_groups() == [[0, 1], [2, 3]] for lay in layouts)
    # the collected ranks are exactly one per engine, and the engines partition the workers
    assert [r for r, lay in enumerate(layouts) if lay.is_collect] == [0, 2]
    assert sorted(r for g in layouts[0].all_groups() for r in g) == [0, 1, 2, 3]


def test_two_workers_in_engines_of_one():
    layouts = [rollout_layout(2, rank, 1) for rank in range(2)]
    assert [(lay.dp, lay.dp_rank, lay.tp_rank, lay.is_collect) for lay in layouts] == [(2, 0, 0, True),
                                                                                       (2, 1, 0, True)]
    assert [lay.group_ranks for lay in layouts] == [[0], [1]]
    assert layouts[1].all_groups() == [[0], [1]]


def test_eight_workers_in_vllm_engines_of_two_data_parallel_ranks_of_two():
    """tp=2, data_parallel_size=2: replicas of 4 ranks; dispatch still goes to the 4 tensor-parallel groups, and
    each replica's request-level leaders are its tensor-rank-0 processes."""
    layouts = [rollout_layout(8, rank, 2, engine_dp=2) for rank in range(8)]
    assert [lay.dp for lay in layouts] == [4] * 8  # dispatch mesh: one data-parallel rank per tensor group
    assert [lay.dp_rank for lay in layouts] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [lay.replica_size for lay in layouts] == [4] * 8
    assert [lay.replica_rank for lay in layouts] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [lay.dp_rank % lay.engine_dp for lay in layouts] == [0, 0, 1, 1, 0, 0, 1, 1]  # vLLM's own dp rank
    assert layouts[5].round_groups() == [[0, 2], [4, 6]]
    assert rollout_layout(4, 0, 1, engine_dp=2).round_groups() == [[0, 1], [2, 3]]
    assert rollout_layout(4, 0, 2).round_groups() == [[0], [2]]  # without engine data parallelism: one each
    with pytest.raises(ValueError, match=r"data_parallel_size=4 x .*tensor_model_parallel_size=2 must divide .* \(4\)"):
        rollout_layout(4, 0, 2, engine_dp=4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="hf", tp=1, dp=2, ep=2, workers=2), r"data_parallel_size=2 / .*expert_parallel_size=2 with "
                                                   r".*rollout\.name=hf: .*use actor_rollout_ref\.rollout\.name=vllm"),
    (dict(name="vllm", tp=1, dp=4, ep=2, workers=4), r"expert_parallel_size=2 must equal .* = 1 x 4 = 4"),
    (dict(name="vllm", tp=2, dp=1, ep=4, workers=4), r"expert_parallel_size=4 must equal .* = 2 x 1 = 2"),
    (dict(name="vllm", tp=1, dp=4, ep=4, workers=6), r"= 1 x 4 = 4 \(ranks per vLLM engine\) must divide .* = 6"),
    (dict(name="vllm", tp=1, dp=0, ep=1, workers=2), r"data_parallel_size=0 .* must be >= 1"),
])
def test_engine_data_and_expert_parallel_checks(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_rollout_parallel(model_path=None, **kwargs)


@pytest.mark.parametrize("tp, dp, ep, workers", [(1, 2, 2, 2), (1, 4, 4, 16), (2, 2, 4, 8), (2, 1, 2, 2),
                                                 (1, 2, 1, 4)])
def test_accepted_engine_data_and_expert_parallel(tp, dp, ep, workers):
    check_rollout_parallel(name="vllm", tp=tp, dp=dp, ep=ep, workers=workers, model_path=None)


def test_layout_is_a_frozen_value():
    lay = rollout_layout(4, 3, "2")  # a string from a config is taken as the int it spells
    assert lay == RolloutLayout(world_size=4, rank=3, tp=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.rank = 0


@pytest.mark.parametrize("world, tp, options", [(4, 3, "[1, 2, 4]"), (6, 4, "[1, 2, 3, 6]"), (2, 0, "[1, 2]")])
def test_layout_refuses_a_size_that_does_not_divide_the_workers(world, tp, options):
    with pytest.raises(ValueError) as info:
        rollout_layout(world, 0, tp)
    message = str(info.value)
    assert f"{KEY}={tp}" in message and f"({world})" in message and options in message


# ---------------------------------------------------------------------------------------------- the driver's check


@pytest.fixture
def gqa_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2}))
    return str(tmp_path)


def test_hf_rollout_has_no_tensor_parallelism():
    with pytest.raises(ValueError) as info:
        check_rollout_parallel(name="hf", tp=2, workers=4, model_path=None)
    message = str(info.value)
    assert f"{KEY}=2" in message and f"{KEY}=1" in message and "rollout.name=vllm" in message
    check_rollout_parallel(name="hf", tp=1, workers=4, model_path=None)  # accepted


def test_engine_size_must_divide_the_workers():
    with pytest.raises(ValueError,
                       match=r"must divide the number of rollout workers .* = 6\); use one of \[1, 2, 3, 6\]"):
        check_rollout_parallel(name="vllm", tp=4, workers=6, model_path=None)
    with pytest.raises(ValueError, match=f"{KEY}=0 must be >= 1"):
        check_rollout_parallel(name="vllm", tp=0, workers=6, model_path=None)


def test_engine_size_must_divide_the_heads(gqa_model):
    assert model_head_counts(gqa_model) == (4, 2)
    with pytest.raises(ValueError) as info:
        check_rollout_parallel(name="vllm", tp=4, workers=4, model_path=gqa_model)
    message = str(info.value)
    assert f"{KEY}=4" in message and "attention heads (4)" in message and "key/value heads (2)" in message
    assert gqa_model in message and message.endswith("use one of [1, 2]")


@pytest.mark.parametrize("name, tp, workers", [("vllm", 2, 4), ("vllm", 1, 4), ("vllm", 4, 4), ("sglang", 2, 2),
                                               ("hf", 1, 3)])
def test_accepted_layouts(tmp_path, name, tp, workers):
    # tp=4 is fine for a model whose heads it divides (MHA, 8 heads), and without a model dir to read
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 8}))
    assert model_head_counts(str(tmp_path)) == (8, 8)  # no kv key: multi-head attention
    check_rollout_parallel(name=name, tp=tp, workers=workers, model_path=str(tmp_path))
    check_rollout_parallel(name=name, tp=tp, workers=workers, model_path=str(tmp_path / "not-a-dir"))


def test_head_counts_of_a_multimodal_config_and_of_unknown_dirs(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_attention_heads": 12,
                                                                      "num_key_value_heads": 3}}))
    assert model_head_counts(str(tmp_path)) == (12, 3)
    assert model_head_counts(str(tmp_path / "missing")) is None
    (tmp_path / "config.json").write_text("{}")
    assert model_head_counts(str(tmp_path)) is None
    check_rollout_parallel(name="vllm", tp=2, workers=2, model_path=str(tmp_path))  # unknown heads: not refused


# ---------------------------------------------------------------------------------------------- row regroup plan


def test_range_overlaps_megatron_vocab_to_vllm_vocab():
    # vocabulary 259: Megatron pads to 384 (192 rows a rank, the real rows end at 259); vLLM pads to 320 (160 rows)
    assert padded_vocab_size(259, 2) == 384
    have, want = [(0, 192), (192, 259)], [(0, 160), (160, 259)]
    assert range_overlaps(have, want) == [[(0, 160), (160, 192)],
                                          [(192, 192), (192, 259)]]


def test_range_overlaps_three_ranks_and_identity():
    have, want = [(0, 4), (4, 8), (8, 10)], [(0, 3), (3, 7), (7, 10)]
    assert range_overlaps(have, want) == [[(0, 3), (3, 4), (7, 7)],
                                          [(4, 4), (4, 7), (7, 8)],
                                          [(8, 8), (8, 8), (8, 10)]]
    assert range_overlaps([(0, 5), (5, 10)], [(0, 5), (5, 10)]) == [[(0, 5), (5, 5)], [(5, 5), (5, 10)]]
    assert range_overlaps([(0, 259)], [(0, 259)]) == [[(0, 259)]]


def test_range_overlaps_rank_holding_only_padding_sends_nothing():
    # vocabulary 259 over 4 Megatron ranks of 96 rows: rank 3 holds rows 288..383, all padding (have = (288, 259))
    rows = padded_vocab_size(259, 4) // 4
    have = [(s * rows, min((s + 1) * rows, 259)) for s in range(4)]
    assert have[3] == (288, 259)
    want = [(0, 80), (80, 160), (160, 240), (240, 259)]
    plan = range_overlaps(have, want)
    assert all(a == b for a, b in plan[3])
    for r, (a, b) in enumerate(want):  # every wanted row comes from exactly one rank
        assert sum(plan[s][r][1] - plan[s][r][0] for s in range(4)) == b - a
    assert plan[2][3] == (240, 259) and plan[1][2] == (160, 192) and plan[2][2] == (192, 240)


# ---------------------------------------------------------------------------------------------- local pieces


def _shapes(groups=2, head_dim=8):
    return Shapes(num_query_groups=groups, head_dim=head_dim, vocab_size=259, padded_vocab=384)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 4)])
@pytest.mark.parametrize("bias", [False, True])
def test_qkv_pieces_are_the_engine_cut(tp, heads, kv_heads, bias):
    gen = torch.Generator().manual_seed(tp * 100 + heads * 10 + kv_heads + bias)
    head_dim, hidden = 8, 32
    rest = () if bias else (hidden,)
    q = torch.randn(heads * head_dim, *rest, generator=gen)
    k = torch.randn(kv_heads * head_dim, *rest, generator=gen)
    v = torch.randn(kv_heads * head_dim, *rest, generator=gen)
    shapes = _shapes(groups=kv_heads, head_dim=head_dim)
    locals_ = [shard("qkv", [q, k, v], r, tp, shapes) for r in range(tp)]
    for r, local in enumerate(locals_):
        pieces = local_hf_pieces("qkv", local, shapes, tp)
        assert len(pieces) == 3
        for got, full in zip(pieces, (q, k, v)):
            assert torch.equal(got, full.chunk(tp)[r])
    # the fused layout is not the plain concatenation (else this test would not test the regrouping)
    if tp == 1 and kv_heads < heads:
        assert not torch.equal(locals_[0], torch.cat([q, k, v]))
    assert all(torch.equal(a, b) for a, b in zip(unshard("qkv", locals_, shapes), (q, k, v)))


@pytest.mark.parametrize("tp", [1, 2])
def test_fc1_row_and_replicated_pieces_are_the_engine_cut(tp):
    gen = torch.Generator().manual_seed(7 + tp)
    hidden, inter = 32, 24
    gate, up = torch.randn(inter, hidden, generator=gen), torch.randn(inter, hidden, generator=gen)
    o, down = torch.randn(hidden, hidden, generator=gen), torch.randn(hidden, inter, generator=gen)
    norm = torch.randn(hidden, generator=gen)
    shapes = _shapes()
    for r in range(tp):
        g, u = local_hf_pieces("fc1", shard("fc1", [gate, up], r, tp, shapes), shapes, tp)
        assert torch.equal(g, gate.chunk(tp)[r]) and torch.equal(u, up.chunk(tp)[r])
        for full in (o, down):
            (piece,) = local_hf_pieces("row", shard("row", [full], r, tp, shapes), shapes, tp)
            assert torch.equal(piece, full.chunk(tp, dim=1)[r])
        (piece,) = local_hf_pieces("rep", shard("rep", [norm], r, tp, shapes), shapes, tp)
        assert torch.equal(piece, norm)
    with pytest.raises(ValueError, match="unknown cut 'mystery'"):
        local_hf_pieces("mystery", norm, shapes, tp)


# ---------------------------------------------------------------------------------------------- gloo regroup


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _regroup_worker(rank, world, port, out_dir, full, rows, vocab, wants):
    """One rank of the vocabulary regroup: holds Megatron's padded rows, receives exactly its wanted rows."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        padded = torch.cat([full, full.new_zeros(rows * world - full.shape[0], full.shape[1])])
        local = padded[rank * rows:(rank + 1) * rows].clone()
        have = [(s * rows, min((s + 1) * rows, vocab)) for s in range(world)]
        for i, want in enumerate(wants):
            plan = range_overlaps(have, want)
            send = torch.cat([local[a - rank * rows:b - rank * rows] for a, b in plan[rank]])
            out_splits = [plan[s][rank][1] - plan[s][rank][0] for s in range(world)]
            out = local.new_empty(sum(out_splits), local.shape[1])
            dist.all_to_all_single(out, send.contiguous(), out_splits, [b - a for a, b in plan[rank]])
            torch.save(out, os.path.join(out_dir, f"want{i}_rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_vocab_regroup_over_gloo(tmp_path):
    vocab, world = 259, 2
    rows = padded_vocab_size(vocab, world) // world
    full = torch.randn(vocab, 6, generator=torch.Generator().manual_seed(0))
    wants = [[(0, 160), (160, 259)],  # vLLM's 160-row shards: rows 160..192 go from rank 0 to rank 1
             [(100, 259), (0, 100)],  # crossed: each rank mostly wants the other's rows
             [(0, 192), (192, 259)]]  # the same split: nothing crosses
    # spawn: a forked child would inherit a default process group another test left in this process
    method = "spawn"
    mp.start_processes(_regroup_worker, args=(world, _free_port(), str(tmp_path), full, rows, vocab, wants),
                       nprocs=world, join=True, start_method=method)
    for i, want in enumerate(wants):
        for rank, (a, b) in enumerate(want):
            got = torch.load(tmp_path / f"want{i}_rank{rank}.pt")
            assert got.shape == (b - a, 6), (i, rank)
            assert torch.equal(got, full[a:b]), (i, rank)


# ---------------------------------------------------------------------------------------------- host default


@pytest.fixture
def ray_env_restored(monkeypatch):
    """On CPU resolve_host_defaults sets Ray variables for the Ray it would start: undo them after the test."""
    for name in (*host_defaults.RAY_ENV, "RAY_ADDRESS"):
        monkeypatch.setenv(name, "placeholder")  # records the original state, restored at teardown
        monkeypatch.delenv(name)


def _ppo(overrides=(), config="ppo_trainer"):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=config, overrides=list(overrides))


@pytest.fixture(scope="module")
def shipped():
    return _ppo()


def _tp(cfg):
    return OmegaConf.select(cfg, KEY)


def _tp_changes(choices):
    return [entry for entry in choices.changed if entry[0] == KEY]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_hf_rollout_gets_one_engine_rank_on_any_device(monkeypatch, ray_env_restored, shipped, device):
    monkeypatch.setattr(host_defaults, "resolve_device", lambda value: device)
    cfg = _ppo(["actor_rollout_ref.rollout.name=hf"])
    assert _tp(cfg) == 2  # the shipped default
    choices = resolve_host_defaults(cfg, set(), shipped)
    assert _tp(cfg) == 1
    ((key, old, new, why),) = _tp_changes(choices)
    assert (old, new) == (2, 1) and "HF generate" in why
    assert f"{KEY}: 2 -> 1" in str(choices)


def test_vllm_gets_one_engine_rank_on_cpu_only(monkeypatch, ray_env_restored, shipped):
    cfg = _ppo(["actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu"])
    choices = resolve_host_defaults(cfg, set(), shipped)
    assert _tp(cfg) == 1 and [(o, n) for _, o, n, _ in _tp_changes(choices)] == [(2, 1)]

    monkeypatch.setattr(host_defaults, "resolve_device", lambda value: "cuda")
    for name in ("vllm", "sglang"):
        cfg = _ppo([f"actor_rollout_ref.rollout.name={name}"])
        choices = resolve_host_defaults(cfg, set(), shipped)
        assert _tp(cfg) == 2 and _tp_changes(choices) == []


def test_engine_size_set_by_the_user_stays(monkeypatch, ray_env_restored, shipped):
    # named on the command line at the default value: kept (and left for validation to refuse with hf)
    cfg = _ppo(["actor_rollout_ref.rollout.name=hf", f"{KEY}=2", "trainer.device=cpu"])
    choices = resolve_host_defaults(cfg, {KEY}, shipped)
    assert _tp(cfg) == 2 and _tp_changes(choices) == []
    # a value other than the shipped default counts as set without an override list
    cfg = _ppo(["actor_rollout_ref.rollout.name=vllm", f"{KEY}=4", "trainer.device=cpu"])
    choices = resolve_host_defaults(cfg, set(), shipped)
    assert _tp(cfg) == 4 and _tp_changes(choices) == []


def test_engine_size_default_against_the_shipped_yaml(ray_env_restored):
    # without a defaults argument the shipped yaml is read from disk
    cfg = _ppo(["actor_rollout_ref.rollout.name=hf", "trainer.device=cpu"])
    resolve_host_defaults(cfg, set())
    assert _tp(cfg) == 1


# ---------------------------------------------------------------------------------------------- the validator


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout-assets")
    write_validator_assets(root, json.dumps({"num_attention_heads": 4, "num_key_value_heads": 2}))
    return root


def _validated_config(assets, *extra, config="ppo_trainer", ranks=4):
    return _ppo([
        f"data.train_files={assets / 'train.parquet'}", f"data.val_files={assets / 'train.parquet'}",
        f"actor_rollout_ref.model.path={assets / 'model'}", f"critic.model.path={assets / 'model'}",
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
        f"trainer.n_gpus_per_node={ranks}", "trainer.logger=console", *extra], config=config)


@pytest.fixture
def vllm_found(monkeypatch):
    """The validator only asks whether vllm is importable: answer yes without needing it installed."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "vllm":
            return real("json")  # any spec: nothing is imported from it
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_validator_refuses_hf_with_two_engine_ranks(assets):
    # set to something else than verl's default: refused, naming the key, the fix and the alternative engine
    cfg = _validated_config(assets, "actor_rollout_ref.rollout.name=hf", f"{KEY}=4")
    with pytest.raises(ConfigError) as info:
        validate_ppo_config(cfg)
    assert f"{KEY}=4" in str(info.value) and f"{KEY}=1" in str(info.value) and "vllm" in str(info.value)
    # left at verl's default (2): the HF engine's size 1 applies, and the config says so
    unset = _validated_config(assets, "actor_rollout_ref.rollout.name=hf")
    validate_ppo_config(unset)
    assert unset.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    plan = validate_ppo_config(_validated_config(assets, "actor_rollout_ref.rollout.name=hf", f"{KEY}=1"))
    assert plan.n_gpus == 4


def test_validator_refuses_engine_sizes_that_do_not_fit(assets, vllm_found):
    with pytest.raises(ConfigError, match=f"{KEY}=3 must divide the number of rollout workers"):
        validate_ppo_config(_validated_config(assets, "actor_rollout_ref.rollout.name=vllm", f"{KEY}=3"))
    with pytest.raises(ConfigError, match=rf"{KEY}=4 must divide the model's attention heads \(4\) and key/value "
                                          rf"heads \(2\)"):
        validate_ppo_config(_validated_config(assets, "actor_rollout_ref.rollout.name=vllm", f"{KEY}=4"))
    # the model's heads are read only when files are checked
    validate_ppo_config(_validated_config(assets, "actor_rollout_ref.rollout.name=vllm", f"{KEY}=4"),
                        check_files=False)
    plan = validate_ppo_config(_validated_config(assets, "actor_rollout_ref.rollout.name=vllm", f"{KEY}=2"))
    assert plan.n_gpus == 4


def test_validator_takes_engine_data_and_expert_parallel_for_vllm(assets, vllm_found):
    dp, ep = "actor_rollout_ref.rollout.data_parallel_size", "actor_rollout_ref.rollout.expert_parallel_size"
    vllm = ("actor_rollout_ref.rollout.name=vllm", f"{KEY}=1")
    plan = validate_ppo_config(_validated_config(assets, *vllm, f"{dp}=2", f"{ep}=2"))
    assert plan.n_gpus == 4
    validate_ppo_config(_validated_config(assets, *vllm, f"{dp}=4", f"{ep}=4"))
    with pytest.raises(ConfigError, match=rf"{ep}=4 must equal .* = 1 x 2 = 2"):
        validate_ppo_config(_validated_config(assets, *vllm, f"{dp}=2", f"{ep}=4"))
    with pytest.raises(ConfigError, match=r"= 1 x 8 = 8 \(ranks per vLLM engine\) must divide"):
        validate_ppo_config(_validated_config(assets, *vllm, f"{dp}=8", f"{ep}=8"))
    with pytest.raises(ConfigError, match=rf"{dp}=2 / .* with actor_rollout_ref.rollout.name=hf"):
        validate_ppo_config(_validated_config(assets, "actor_rollout_ref.rollout.name=hf", f"{KEY}=1", f"{dp}=2"))
    with pytest.raises(ConfigError, match=r"pipeline_model_parallel_size=2 is not supported"):
        validate_ppo_config(_validated_config(assets, *vllm, "actor_rollout_ref.rollout.pipeline_model_parallel_size=2"))


MEGATRON_TP2_PP2 = ["actor_rollout_ref.rollout.name=hf", f"{KEY}=1",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
                    "critic.ppo_micro_batch_size_per_gpu=2"]


def test_megatron_batch_is_split_over_its_data_parallel_ranks_only(assets):
    cfg = _validated_config(assets, *MEGATRON_TP2_PP2, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                            config="ppo_megatron_trainer")
    plan = validate_ppo_config(cfg, check_files=False)
    actor = plan.batch_sizes["actor"]
    # 4 ranks = one data-parallel rank x (2 tensor x 2 pipeline): the whole mini-batch of 4 in 2 micro-batches of 2
    assert (actor.dp_size, actor.ppo_mini_batch_size, actor.gradient_accumulation_steps) == (1, 4, 2)
    assert plan.batch_sizes["rollout"].dp_size == 1
    # the same numbers with FSDP (4 data-parallel ranks of 1 row) are refused
    with pytest.raises(ConfigError, match=r"= 4 \* 1 / 4 = 1\) must be a multiple of "
                                          r"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"):
        validate_ppo_config(_validated_config(assets, *MEGATRON_TP2_PP2), check_files=False)


def test_rollout_architecture_gap_is_a_hardware_refusal(tmp_path):
    """vLLM's CPU backend cannot decode a DeepSeek-V3 (multi-latent attention) model: refused as needing CUDA,
    with the HF rollout named; other engines, devices and architectures pass."""
    from verl.workers.rollout.layout import check_rollout_architecture

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    with pytest.raises(ValueError, match=r"rollout.name=vllm with a DeepseekV3ForCausalLM model .* needs CUDA.*"
                                         r"rollout.name=hf"):
        check_rollout_architecture(name="vllm", device="cpu", model_path=str(tmp_path))
    check_rollout_architecture(name="hf", device="cpu", model_path=str(tmp_path))
    check_rollout_architecture(name="vllm", device="cuda", model_path=str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    check_rollout_architecture(name="vllm", device="cpu", model_path=str(tmp_path))
    check_rollout_architecture(name="vllm", device="cpu", model_path=str(tmp_path / "missing"))
