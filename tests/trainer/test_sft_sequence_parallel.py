"""SFT with ``ulysses_sequence_parallel_size`` / ``use_remove_padding``: the trainer's step is the same step.

``FSDPSFTTrainer.training_step`` (its batch layout, loss and data-parallel token reductions) runs on the FSDP
engine (tiny Qwen2 in float64, gloo): one process with padded rows (``use_remove_padding=False``) is the
reference; 2 processes x sequence parallel 2 (one group) and 4 processes as 2 data-parallel groups x sequence
parallel 2 (each group holds half the rows) must give the same loss, gradient norm and weights after the step.
"""

import os
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "workers", "actor"))
from engine_testlib import run_distributed, tiny_model  # noqa: E402

from verl.trainer.fsdp_sft_trainer import FSDPSFTTrainer, sft_batch  # noqa: E402
from verl.utils.fsdp_utils import apply_fsdp2  # noqa: E402
from verl.utils.ulysses import init_ulysses_groups  # noqa: E402
from verl.workers.engine import FSDPEngine  # noqa: E402

ROWS, WIDTH, MICRO, LR = 8, 16, 2, 0.5
# the model runs in float64; the engine hands log-probs to the loss in float32, hence float32-level agreement
TOL = dict(rtol=1e-6, atol=1e-7)


def _rows() -> dict:
    """Right-padded SFT rows of different lengths (the datasets' layout), loss on the tail of each row."""
    gen = torch.Generator().manual_seed(7)
    lengths = torch.randint(5, WIDTH - 2, (ROWS,), generator=gen)  # every row leaves padding columns at the end
    input_ids = torch.randint(1, 100, (ROWS, WIDTH), generator=gen)
    attention_mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask
    prompt = torch.randint(2, 4, (ROWS,), generator=gen)
    loss_mask = attention_mask * (torch.arange(WIDTH)[None, :] >= prompt[:, None]).long()
    position_ids = torch.clamp(torch.cumsum(attention_mask, -1) - 1, min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
            "loss_mask": loss_mask}


def _model():
    return tiny_model(seed=3).double()


def _trainer(engine, dp_group=None) -> FSDPSFTTrainer:
    """The trainer's step method on an engine built here (no config, dataset or model directory needed)."""
    trainer = FSDPSFTTrainer.__new__(FSDPSFTTrainer)
    trainer.engine, trainer.dp_group = engine, dp_group
    trainer.plan = SimpleNamespace(micro_batch_size_per_rank=MICRO)
    return trainer


def _sp_worker(rank, world, out_dir):
    groups = init_ulysses_groups(2)
    model = apply_fsdp2(_model())  # float64: plain fully_shard (reshards after forward), no dtype cast
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=LR), use_remove_padding=True, ulysses=groups)
    share = ROWS // groups.dp_size  # data-parallel group g holds rows [g*share, (g+1)*share)
    rows = {k: v[groups.dp_rank * share:(groups.dp_rank + 1) * share] for k, v in _rows().items()}
    metrics = _trainer(engine, engine.dp_group).training_step(rows)
    params = {n: p.detach().clone() for n, p in engine.iter_full_params()}
    if rank == 0:
        torch.save({"metrics": metrics, "params": params}, os.path.join(out_dir, "sp.pt"))
    dist.barrier()


def _reference():
    model = _model()
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=LR), use_remove_padding=False)
    metrics = _trainer(engine).training_step(_rows())
    return metrics, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_sft_batch_cuts_trailing_padding_only():
    rows = _rows()
    data = sft_batch(rows)
    width = int(rows["attention_mask"].sum(-1).max())
    assert width < WIDTH and data.batch["input_ids"].shape == (ROWS, width)
    assert torch.equal(data.batch["responses"], rows["input_ids"][:, 1:width])
    assert data.batch["response_mask"].sum() == rows["loss_mask"][:, 1:].sum()  # no trained token lost


@pytest.mark.parametrize("world", [2, 4], ids=["sp2", "dp2xsp2"])
def test_sequence_parallel_step_matches_one_process(tmp_path, world):
    run_distributed(_sp_worker, world, str(tmp_path), err_dir=str(tmp_path))
    want_metrics, want_params = _reference()
    got = torch.load(tmp_path / "sp.pt")
    assert got["metrics"]["train/loss"] == pytest.approx(want_metrics["train/loss"], rel=1e-7)
    assert got["metrics"]["train/grad_norm"] == pytest.approx(want_metrics["train/grad_norm"], rel=1e-6)
    start = dict(_model().named_parameters())
    assert max((want_params[n] - start[n]).abs().max().item() for n in want_params) > 1e-3  # the step moved
    for name, p in want_params.items():
        torch.testing.assert_close(got["params"][name], p, **TOL, msg=name)
