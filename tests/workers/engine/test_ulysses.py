"""Ulysses sequence parallelism in the FSDP engine (gloo, tiny Qwen2, fp32).

The reference is the same engine on one process without sequence parallelism (padding trimmed, sdpa with the
padding mask). With SP=2 each micro-batch's packed sequence is split over two ranks and attention all-to-alls
between them: log-probs, entropies and the weights after one optimizer step must agree to 1e-5. With 4 ranks
(dp=2 x sp=2) each data-parallel group must count its rows once, so the step equals the one-process step on
both groups' rows.
"""

import copy
import os
import sys

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import make_batch, run_distributed, tiny_config, tiny_model  # noqa: E402
from transformers import Qwen2ForTokenClassification  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.utils.fsdp_utils import apply_fsdp2  # noqa: E402
from verl.utils.ulysses import check_ulysses_size, init_ulysses_groups  # noqa: E402
from verl.workers.config import FSDPEngineConfig  # noqa: E402
from verl.workers.engine import FSDPEngine, MicroBatchSpec, TrainSpec  # noqa: E402

LR = 0.05
TOL = dict(rtol=1e-5, atol=1e-5)


def _loss(outputs, micro, ctx):
    lp, mask = outputs["log_probs"], micro["response_mask"].float()
    value = -(lp * mask).sum() / mask.sum() - 0.1 * (outputs["entropy"] * mask).sum() / mask.sum()
    return value, {"loss": value}


SPEC = TrainSpec(mini_batch_size=8, micro=MicroBatchSpec(3), outputs=("log_probs", "entropy"))


def _data(seed):
    return DataProto.from_dict(make_batch(bsz=8, prompt_len=7, resp_len=6, seed=seed))


def _reference(datas):
    """One process, no SP: log-probs/entropy of each batch, then one step on all rows together."""
    model = tiny_model(seed=4)
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=LR), use_remove_padding=True)
    outs = [engine.infer(d, ("log_probs", "entropy"), MicroBatchSpec(3)) for d in datas]
    spec = TrainSpec(**{**SPEC.__dict__, "mini_batch_size": 8 * len(datas)})
    engine.train_batch(DataProto.concat(datas), _loss, spec)
    return outs, {n: p.detach().clone() for n, p in model.named_parameters()}


def _sp_worker(rank, world, sp, out_dir):
    groups = init_ulysses_groups(sp)
    assert groups.sp_size == sp and groups.dp_size == world // sp
    model = apply_fsdp2(tiny_model(seed=4), FSDPEngineConfig(dtype="fp32", reshard_after_forward=True))
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=LR), use_remove_padding=True,
                        ulysses=groups)
    assert engine.dp_size == world // sp
    data = _data(seed=10 + groups.dp_rank)  # the ranks of one sp group hold the same rows
    out = engine.infer(data, ("log_probs", "entropy"), MicroBatchSpec(3))
    metrics = engine.train_batch(data, _loss, SPEC)
    params = dict(engine.iter_full_params())
    if groups.sp_rank == 0:
        torch.save({"out": out, "metrics": metrics}, os.path.join(out_dir, f"dp{groups.dp_rank}.pt"))
    if rank == 0:
        torch.save(params, os.path.join(out_dir, "params.pt"))
    dist.barrier()


@pytest.mark.parametrize("world", [2, 4], ids=["sp2", "dp2xsp2"])
def test_sp2_matches_one_process(tmp_path, world):
    run_distributed(_sp_worker, world, 2, str(tmp_path), err_dir=str(tmp_path))
    datas = [_data(seed=10 + g) for g in range(world // 2)]
    want_outs, want_params = _reference(datas)
    for g in range(world // 2):
        got = torch.load(tmp_path / f"dp{g}.pt")
        mask = datas[g].batch["response_mask"].bool()
        for name in ("log_probs", "entropy"):
            torch.testing.assert_close(got["out"][name][mask], want_outs[g][name][mask], **TOL, msg=name)
        assert got["metrics"]["grad_norm"][0] > 0
    got_params = torch.load(tmp_path / "params.pt")
    start = dict(tiny_model(seed=4).named_parameters())
    moved = max((got_params[n] - start[n]).abs().max().item() for n in want_params)
    assert moved > 1e-3  # the step did something, so agreement below means something
    for name, p in want_params.items():
        torch.testing.assert_close(got_params[name], p, **TOL, msg=name)


def _value_model():
    torch.manual_seed(6)
    cfg = tiny_config()
    cfg.num_labels, cfg._attn_implementation = 1, "sdpa"
    return Qwen2ForTokenClassification(cfg).float()


def _values_worker(rank, world, out_dir):
    groups = init_ulysses_groups(2)
    engine = FSDPEngine(apply_fsdp2(_value_model()), use_remove_padding=True, ulysses=groups)
    values = engine.infer(_data(seed=3), ("values",), MicroBatchSpec(4))["values"]
    torch.save(values, os.path.join(out_dir, f"values{rank}.pt"))


def test_sp2_critic_values_match_one_process(tmp_path):
    run_distributed(_values_worker, 2, str(tmp_path), err_dir=str(tmp_path))
    data = _data(seed=3)
    want = FSDPEngine(_value_model(), use_remove_padding=True).infer(data, ("values",), MicroBatchSpec(4))["values"]
    mask = data.batch["response_mask"].bool()
    for rank in range(2):
        got = torch.load(tmp_path / f"values{rank}.pt")
        torch.testing.assert_close(got[mask], want[mask], **TOL)
    assert want[mask].abs().max() > 0


def test_size_checks_name_the_key():
    check_ulysses_size(2, 4, 4, 2)
    with pytest.raises(ValueError, match="actor.ulysses_sequence_parallel_size=3 must divide the number of proc"):
        check_ulysses_size(3, 4, key="actor.ulysses_sequence_parallel_size")
    with pytest.raises(ValueError, match=r"key/value heads \(2\)"):
        check_ulysses_size(4, 4, 4, 2)
    with pytest.raises(ValueError, match=r"attention heads \(4\)"):
        check_ulysses_size(8, 8, 4, 8)


def test_sp_engine_refuses_padded_mode():
    groups = type("G", (), {"sp_size": 2, "dp_group": None})()
    with pytest.raises(ValueError, match="use_remove_padding=True"):
        FSDPEngine(copy.deepcopy(tiny_model()), use_remove_padding=False, ulysses=groups)
