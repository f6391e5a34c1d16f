"""Model merger CLI: clear errors, and a single-process checkpoint merged into a loadable HF model."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "workers", "actor"))
from engine_testlib import tiny_model  # noqa: E402

from verl.model_merger.__main__ import main  # noqa: E402


def test_missing_local_dir_is_a_clear_error(tmp_path, capsys):
    rc = main(["merge", "--backend", "fsdp", "--local_dir", str(tmp_path / "nope"), "--target_dir", str(tmp_path / "o")])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty" / "huggingface").mkdir(parents=True)
    (tmp_path / "empty" / "huggingface" / "config.json").write_text(tiny_model().config.to_json_string())
    rc = main(["merge", "--backend", "fsdp", "--local_dir", str(tmp_path / "empty"), "--target_dir", str(tmp_path / "o")])
    assert rc == 2 and "shard files" in capsys.readouterr().err


def test_merge_single_process_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM

    from verl.trainer.config_schema.engine import CheckpointConfig
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    model = tiny_model(seed=8, tie=False)
    checkpoint = CheckpointConfig(save_contents=["model"])
    FSDPCheckpointManager(model, None, None, None, checkpoint_config=checkpoint).save_checkpoint(
        local_path=str(tmp_path / "global_step_1" / "actor"), global_step=1)
    out = tmp_path / "hf"
    assert main(["merge", "--backend", "fsdp", "--local_dir", str(tmp_path / "global_step_1" / "actor"),
                 "--target_dir", str(out), "--max_shard_size_gb", "0.00002"]) == 0
    assert (out / "model.safetensors.index.json").exists()  # several shards at this tiny limit
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ids = torch.randint(3, 200, (2, 7))
    with torch.no_grad():
        assert torch.equal(merged(input_ids=ids).logits, model(input_ids=ids).logits)
