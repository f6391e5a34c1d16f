"""Checkpoint layouts and resharding: a checkpoint laid out the way verl writes it (2 FSDP2 gloo ranks,
``torch.save(model.state_dict())``, ``torch.save(optimizer.state_dict())``, ``{"lr_scheduler", "rng"}``), one
written by FSDPCheckpointManager and one in this package's older wrapped format are each loaded on 1 rank (model,
Adam moments, lr) and merged to HF by the model merger; unreadable checkpoints give errors naming what was found."""

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "workers", "actor"))
from engine_testlib import run_distributed, tiny_model  # noqa: E402

from verl.trainer.config_schema.engine import CheckpointConfig  # noqa: E402
from verl.utils.checkpoint.fsdp_layout import WRAPPED_FORMAT, CheckpointFormatError  # noqa: E402
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig  # noqa: E402

OPTIM = FSDPOptimizerConfig(lr=1e-2, lr_scheduler_type="cosine", lr_warmup_steps=1)
IDS = torch.randint(3, 250, (2, 7), generator=torch.Generator().manual_seed(0))


def _train_one_step(seed):
    from torch.distributed.tensor import DTensor

    from verl.utils.fsdp_utils import apply_fsdp2, build_lr_scheduler, build_optimizer

    model = tiny_model(seed=seed)
    if torch.distributed.is_initialized():
        apply_fsdp2(model, FSDPEngineConfig(dtype="fp32"))
    optim = build_optimizer(model.parameters(), OPTIM)
    sched = build_lr_scheduler(optim, OPTIM, total_steps=10)
    model(input_ids=IDS, labels=IDS).loss.backward()
    optim.step()
    sched.step()
    optim.zero_grad()
    assert all(isinstance(p, DTensor) for p in model.parameters()) == torch.distributed.is_initialized()
    return model, optim, sched


def _full_optim_state(optim):
    from torch.distributed.tensor import DTensor

    out = {}
    for i, p in enumerate(q for g in optim.param_groups for q in g["params"]):
        for k, v in optim.state[p].items():
            out[(i, k)] = v.full_tensor() if isinstance(v, DTensor) else v.clone()
    return out


def _write_verl_layout(model, optim, sched, path, rank, world):
    """What verl's FSDPCheckpointManager writes for FSDP2 (state dicts saved as they are)."""
    from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

    os.makedirs(path, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(path, f"model_world_size_{world}_rank_{rank}.pt"))
    torch.save(optim.state_dict(), os.path.join(path, f"optim_world_size_{world}_rank_{rank}.pt"))
    torch.save({"lr_scheduler": sched.state_dict(), "rng": BaseCheckpointManager.get_rng_state()},
               os.path.join(path, f"extra_state_world_size_{world}_rank_{rank}.pt"))
    if rank == 0:
        with open(os.path.join(path, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2, "world_size": world}, f)
        model.config.save_pretrained(os.path.join(path, "huggingface"))


def _write_wrapped_layout(model, optim, path, rank, world):
    """The older wrapped files of this package: local shards + placement records."""
    from torch.distributed.tensor import DTensor

    os.makedirs(path, exist_ok=True)
    tensors, meta = {}, {}
    for k, v in model.state_dict().items():
        tensors[k] = v.to_local().clone()
        meta[k] = {"shape": list(v.shape), "placements": [["shard", v.placements[0].dim]],
                   "mesh_shape": list(v.device_mesh.shape), "coordinate": list(v.device_mesh.get_coordinate())}
    torch.save({"format": WRAPPED_FORMAT, "state_dict": tensors, "dtensor": meta},
               os.path.join(path, f"model_world_size_{world}_rank_{rank}.pt"))
    sd = optim.state_dict()
    keys = [[i, k] for i, e in sd["state"].items() for k, v in e.items() if isinstance(v, DTensor)]
    state = {i: {k: v.to_local().clone() if isinstance(v, DTensor) else v for k, v in e.items()}
             for i, e in sd["state"].items()}
    torch.save({"format": WRAPPED_FORMAT, "state_dict": {"state": state, "param_groups": sd["param_groups"]},
                "dtensor_keys": keys}, os.path.join(path, f"optim_world_size_{world}_rank_{rank}.pt"))
    if rank == 0:
        with open(os.path.join(path, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2, "world_size": world, "format": WRAPPED_FORMAT}, f)
        model.config.save_pretrained(os.path.join(path, "huggingface"))


def _writer(rank, world, root):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import get_full_state_dict

    model, optim, sched = _train_one_step(seed=3)
    _write_verl_layout(model, optim, sched, os.path.join(root, "verl"), rank, world)
    _write_wrapped_layout(model, optim, os.path.join(root, "wrapped"), rank, world)
    FSDPCheckpointManager(model, optim, sched, None).save_checkpoint(os.path.join(root, "ours"), global_step=1)
    full, moments = get_full_state_dict(model), _full_optim_state(optim)
    if rank == 0:
        torch.save({"model": full, "optim": moments, "lr": sched.get_last_lr()[0]}, os.path.join(root, "ref.pt"))


@pytest.fixture(scope="module")
def two_rank_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    run_distributed(_writer, 2, str(root), err_dir=str(root))
    return root, torch.load(root / "ref.pt", weights_only=False)


@pytest.mark.parametrize("layout", ["verl", "ours", "wrapped"])
def test_two_rank_checkpoint_loads_on_one_rank_and_merges(two_rank_checkpoints, layout, tmp_path):
    from transformers import AutoModelForCausalLM

    from verl.model_merger.__main__ import main
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    root, ref = two_rank_checkpoints
    ckpt = root / layout
    if layout == "ours":
        names = set(os.listdir(ckpt))
        assert {"model_world_size_2_rank_1.pt", "optim_world_size_2_rank_0.pt", "extra_state_world_size_2_rank_1.pt",
                "fsdp_config.json", "huggingface"} <= names
        assert json.loads((ckpt / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": 2}
        saved = torch.load(ckpt / "model_world_size_2_rank_0.pt", weights_only=False)  # verl's: a bare state dict
        assert type(saved).__name__ == "dict" and type(saved["lm_head.weight"]).__name__ == "DTensor"
        assert saved["model.embed_tokens.weight"].to_local().shape == (130, 32)  # 259 rows cut 130 + 129

    model, optim, sched = _train_one_step(seed=9)  # other weights and moments, one process, unsharded
    load = ["model", "optimizer", "extra"] if layout != "wrapped" else ["model", "extra"]
    mgr = FSDPCheckpointManager(model, optim, sched, None, checkpoint_config=CheckpointConfig(load_contents=load))
    mgr.load_checkpoint(str(ckpt))
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref["model"][k]), k
    if layout != "wrapped":
        got = _full_optim_state(optim)
        assert got.keys() == ref["optim"].keys()
        for key, v in ref["optim"].items():
            assert torch.equal(got[key], v), key
        assert sched.get_last_lr()[0] == ref["lr"]
    else:  # older wrapped optimizer files name no placement: only the saved number of ranks can resume them
        with pytest.raises(CheckpointFormatError, match="saved by 2 ranks"):
            FSDPCheckpointManager(model, optim, sched, None).load_checkpoint(str(ckpt))

    out = tmp_path / "hf"
    assert main(["merge", "--backend", "fsdp", "--local_dir", str(ckpt), "--target_dir", str(out),
                 "--max_shard_size", "20KB"]) == 0
    assert (out / "model.safetensors.index.json").exists() and (out / "generation_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(merged(input_ids=IDS).logits, model(input_ids=IDS).logits)


def test_unreadable_checkpoints_say_what_was_found(tmp_path):
    from verl.model_merger.fsdp_model_merger import load_fsdp_checkpoint
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import build_optimizer

    model = tiny_model(seed=1)
    mgr = FSDPCheckpointManager(model, build_optimizer(model.parameters(), FSDPOptimizerConfig(lr=1e-3)), None, None)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mgr.load_checkpoint(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(CheckpointFormatError, match=r"no model_world_size_<W>_rank_<r>\.pt .*found: notes\.txt"):
        mgr.load_checkpoint(str(tmp_path / "empty"))

    mgr.save_checkpoint(local_path=str(tmp_path / "c"), global_step=1)
    torch.save({"format": "something-else", "state_dict": {}}, tmp_path / "c" / "model_world_size_1_rank_0.pt")
    with pytest.raises(CheckpointFormatError, match="format 'something-else'; readable formats"):
        mgr.load_checkpoint(str(tmp_path / "c"))
    torch.save([1, 2], tmp_path / "c" / "model_world_size_1_rank_0.pt")
    with pytest.raises(CheckpointFormatError, match="holds a list; expected a model state dict"):
        load_fsdp_checkpoint(str(tmp_path / "c"))
    torch.save({"lm_head.weight": torch.zeros(2)}, tmp_path / "c" / "model_world_size_1_rank_0.pt")
    with pytest.raises(CheckpointFormatError, match="missing .*expected a checkpoint of the same architecture"):
        mgr.load_checkpoint(str(tmp_path / "c"))
    os.rename(tmp_path / "c" / "model_world_size_1_rank_0.pt", tmp_path / "c" / "model_world_size_2_rank_0.pt")
    with pytest.raises(CheckpointFormatError, match="world sizes|ranks \\[1\\] are missing"):
        mgr.load_checkpoint(str(tmp_path / "c"))


def test_hf_upload_offline_is_a_clear_error(tmp_path, monkeypatch, capsys):
    from verl.model_merger.__main__ import main

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit, match="HF_HUB_OFFLINE=1"):
        main(["merge", "--backend", "fsdp", "--local_dir", str(tmp_path), "--hf_upload_path", "me/model"])
