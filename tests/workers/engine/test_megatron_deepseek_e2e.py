"""DeepSeek-V3 (multi-latent attention, grouped expert routing, a shared expert) through verl's Megatron command
line on CPU: ``main_ppo --config-name=ppo_megatron_trainer``, GRPO, 2 steps, two processes, EP=2 (4 of the 8 routed
experts each), fp32, ``rollout.name=hf`` (vLLM's CPU backend cannot decode multi-latent attention). After every
weight push (Megatron -> HF names: the low-rank query/key-value projections, the router's correction bias, the
shared and the routed experts from the expert-parallel rank that holds them) the HF rollout's log-probs of the
sampled tokens equal the Megatron trainer's (``training/rollout_probs_diff_max`` <= 1e-3; measured 9.9e-5 and
1.8e-5). The HF rollout starts from the checkpoint, so step 2 (after an update with gradient norm ~0.7 at lr 1e-2)
is the step that shows the push."""

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_megatron_moe_e2e import assert_in_sync_two_steps, megatron_grpo_args, run_main  # noqa: E402

from verl.utils.embedded.moe import make_moe_model_dir  # noqa: E402


def _deepseek_dir(tmp_path: Path) -> Path:
    """The tiny DeepSeek-V3 of the engine tests, with the embedded tokenizer and its special tokens."""
    from test_megatron_deepseek import make_deepseek_dir

    from transformers import AutoConfig

    tokenizer_dir = Path(make_moe_model_dir(str(tmp_path / "tok"), seed=0))
    path = Path(make_deepseek_dir(str(tmp_path / "deepseek")))
    moe = AutoConfig.from_pretrained(tokenizer_dir)
    config = json.loads((path / "config.json").read_text())
    config.update(pad_token_id=moe.pad_token_id, bos_token_id=moe.bos_token_id, eos_token_id=moe.eos_token_id)
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").unlink(missing_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, path / f.name)
    return path


@pytest.mark.e2e
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_megatron_deepseek_ep2_grpo_hf_rollout_in_sync(tmp_path):
    steps = run_main(tmp_path / "run", megatron_grpo_args(tmp_path, _deepseek_dir(tmp_path),
                                                          "actor_rollout_ref.rollout.name=hf"))
    assert_in_sync_two_steps(steps)
