"""Multi-turn config errors surface in config validation (before any worker starts), and the dataset hands the
agent loop its per-row fields (agent_name, tools_kwargs, raw_prompt)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from tests.trainer.validator_assets import write_validator_assets
from verl.trainer.config_schema.validate import validate_ppo_config
from verl.utils.config import ConfigError

REPO = Path(__file__).resolve().parents[3]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")
TOOLS = REPO / "examples/multiturn/config/tool_config/calculator_tool_config.yaml"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    write_validator_assets(root)
    return root


def ppo(assets, *extra):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"data.train_files={assets / 'train.parquet'}", f"data.val_files={assets / 'train.parquet'}",
            f"actor_rollout_ref.model.path={assets / 'model'}", "actor_rollout_ref.rollout.name=hf",
            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=2", "trainer.logger=console", *extra])


MT = "actor_rollout_ref.rollout.multi_turn"


def test_valid_multiturn_config_passes(assets):
    validate_ppo_config(ppo(assets, "actor_rollout_ref.rollout.mode=async", f"{MT}.enable=True",
                            f"{MT}.tool_config_path={TOOLS}", f"{MT}.max_assistant_turns=3",
                            f"{MT}.tool_response_truncate_side=left"))
    validate_ppo_config(ppo(assets, "actor_rollout_ref.rollout.mode=sync"))


def test_multiturn_config_errors(assets, tmp_path):
    no_class = tmp_path / "no_class.yaml"
    no_class.write_text("tools:\n  - config: {type: native}\n")
    bad_import = tmp_path / "bad_import.yaml"
    bad_import.write_text("tools:\n  - class_name: verl.tools.no_such_module.Tool\n")
    bad_interaction = tmp_path / "bad_interaction.yaml"
    bad_interaction.write_text("interaction:\n  - name: x\n")
    cases = [
        ((f"{MT}.tool_config_path={no_class}",), "tools\\[0\\] has no class_name"),
        ((f"{MT}.tool_config_path={bad_import}",), "cannot import verl.tools.no_such_module"),
        ((f"{MT}.tool_config_path={tmp_path / 'missing.yaml'}",), "no such file"),
        (("actor_rollout_ref.rollout.mode=sync", f"{MT}.enable=True"), "set actor_rollout_ref.rollout.mode=async"),
        (("actor_rollout_ref.rollout.agent.default_agent_loop=nope",), "default_agent_loop='nope' is not a registered"),
        ((f"{MT}.format=xml",), "format='xml' is not a known tool-call format"),
        ((f"{MT}.tool_response_truncate_side=top",), "tool_response_truncate_side"),
        ((f"{MT}.max_parallel_calls=0",), "max_parallel_calls"),
        ((f"{MT}.interaction_config_path={tmp_path / 'x.yaml'}",), "interaction_config_path=.*no such file"),
        ((f"{MT}.interaction_config_path={bad_interaction}",), "interaction\\[0\\] has no class_name"),
        (("actor_rollout_ref.rollout.agent.num_workers=2",), "num_workers=2 is not supported"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            validate_ppo_config(ppo(assets, *overrides))


def test_dataset_gives_agent_fields(tmp_path):
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.utils.embedded.tokenizer import load_tokenizer

    subprocess.run([sys.executable, str(REPO / "examples/multiturn/calculator_data.py"), "--local_dir",
                    str(tmp_path), "--train_size", "4", "--test_size", "2"], check=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    cfg = {"max_prompt_length": 256, "return_raw_chat": True}
    ds = RLHFDataset(str(tmp_path / "train.parquet"), load_tokenizer(), cfg)
    batch = collate_fn([ds[i] for i in range(4)])
    assert list(batch["agent_name"]) == ["tool_agent"] * 4
    truths = [row["reward_model"]["ground_truth"] for row in ds.dataframe]
    assert [tk["calculator"]["create_kwargs"]["ground_truth"] for tk in batch["tools_kwargs"]] == truths
    assert batch["raw_prompt"][0][0]["role"] == "system" and "<tool_call>" in batch["raw_prompt"][0][0]["content"]
    assert isinstance(batch["interaction_kwargs"], np.ndarray) and batch["interaction_kwargs"][0] == {}
