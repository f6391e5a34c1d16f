"""Per-rank batch sizes are derived once, by one pure function (verl's normalisation rules), and the driver's
validation reports the same numbers the workers will use."""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.trainer.validator_assets import write_validator_assets
from verl.trainer.config_schema import validate_ppo_config
from verl.trainer.config_schema.validate import typed_ppo_config
from verl.utils.batch_sizes import NormalizedBatchSizes, normalized_batch_sizes
from verl.utils.config import ConfigError

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "verl" / "trainer" / "config")


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
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "trainer.n_gpus_per_node=2", *extra])


def test_actor_sizes_per_rank():
    actor = {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "use_dynamic_bsz": False,
             "log_prob_micro_batch_size_per_gpu": 3}
    sizes = normalized_batch_sizes(actor, rollout_n=4, dp_size=2)
    # 4 prompts x 4 samples over 2 ranks = 8 responses per rank per optimizer step, in 4 micro-batches of 2
    assert (sizes.ppo_mini_batch_size, sizes.ppo_micro_batch_size_per_gpu, sizes.gradient_accumulation_steps) == (8, 2, 4)
    assert sizes.log_prob_micro_batch_size_per_gpu == 3 and sizes.dp_size == 2 and sizes.rollout_n == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        sizes.ppo_mini_batch_size = 1


def test_deprecated_global_micro_sizes_are_divided_by_the_ranks():
    # verl's critic: ppo_micro_batch_size_per_gpu follows the global key through an interpolation, so the resolved
    # section holds the undivided value there too; the global key wins, divided by the ranks
    critic = {"ppo_mini_batch_size": 8, "ppo_micro_batch_size": 4, "ppo_micro_batch_size_per_gpu": 4,
              "forward_micro_batch_size": 4, "forward_max_token_len_per_gpu": 32768}
    sizes = normalized_batch_sizes(critic, rollout_n=1, dp_size=2, prefix="critic.")
    assert (sizes.ppo_mini_batch_size, sizes.ppo_micro_batch_size_per_gpu) == (4, 2)
    assert sizes.forward_micro_batch_size_per_gpu == 2 and sizes.gradient_accumulation_steps == 2
    rollout = normalized_batch_sizes({"log_prob_micro_batch_size": 8}, rollout_n=1, dp_size=4)
    assert rollout.log_prob_micro_batch_size_per_gpu == 2 and rollout.ppo_mini_batch_size is None
    rm = normalized_batch_sizes({"micro_batch_size": 6}, rollout_n=1, dp_size=3)
    assert rm.micro_batch_size_per_gpu == 2


def test_critic_forward_micro_size_defaults_to_its_training_micro_size():
    critic = {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 2, "forward_max_token_len_per_gpu": 100}
    assert normalized_batch_sizes(critic, rollout_n=2, dp_size=2).forward_micro_batch_size_per_gpu == 2


def test_dynamic_batch_size_needs_no_micro_size():
    sizes = normalized_batch_sizes({"ppo_mini_batch_size": 3, "use_dynamic_bsz": True}, rollout_n=2, dp_size=3)
    assert sizes.ppo_mini_batch_size == 2 and sizes.ppo_micro_batch_size_per_gpu is None
    assert sizes.gradient_accumulation_steps is None and sizes.use_dynamic_bsz


@pytest.mark.parametrize("section, n, dp, message", [
    ({"ppo_mini_batch_size": 3, "ppo_micro_batch_size_per_gpu": 1}, 1, 2,
     r"actor.ppo_mini_batch_size \* rollout.n \(= 3 \* 1\) must split evenly over 2 data-parallel ranks"),
    ({"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 3}, 2, 2,
     r"= 4 \* 2 / 2 = 4\) must be a multiple of actor.ppo_micro_batch_size_per_gpu=3.*divisors of 4: \[1, 2, 4\]"),
    ({"ppo_mini_batch_size": 4}, 1, 1, r"set 'actor.ppo_micro_batch_size_per_gpu'"),
    ({"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 3}, 1, 2,
     r"actor.ppo_micro_batch_size=3 must split evenly over 2 data-parallel ranks"),
    ({"ppo_mini_batch_size": 0, "ppo_micro_batch_size_per_gpu": 1}, 1, 1, r"actor.ppo_mini_batch_size=0 must be"),
    ({"ppo_mini_batch_size": 2.5, "ppo_micro_batch_size_per_gpu": 1}, 1, 1, r"actor.ppo_mini_batch_size=2.5 must be an integer"),
])
def test_sizes_that_do_not_divide_name_the_key(section, n, dp, message):
    with pytest.raises(ConfigError, match=message):
        normalized_batch_sizes(section, rollout_n=n, dp_size=dp, prefix="actor.")


def test_the_driver_plan_carries_the_per_rank_sizes(assets):
    cfg = ppo(assets, "actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=grpo",
              "actor_rollout_ref.actor.use_kl_loss=true")
    plan = validate_ppo_config(cfg)
    assert set(plan.batch_sizes) == {"actor", "rollout", "ref"}  # GRPO: no critic; KL loss: a reference policy
    actor = plan.batch_sizes["actor"]
    assert isinstance(actor, NormalizedBatchSizes)
    assert (actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, actor.gradient_accumulation_steps) == (8, 2, 4)
    section = OmegaConf.to_container(cfg.actor_rollout_ref.actor, resolve=True)
    assert actor == normalized_batch_sizes(section, rollout_n=4, dp_size=2, prefix="actor_rollout_ref.actor.")
    assert plan.batch_sizes["ref"].log_prob_micro_batch_size_per_gpu == 2


def test_typed_sections_give_the_sizes_of_the_config_as_written(assets):
    """A role's typed section (what workers and the driver hold) and its DictConfig give the same sizes; a key the
    role's section does not have (the rollout's ppo_*, the actor's forward_*) reads as unset."""
    cfg = ppo(assets, "actor_rollout_ref.rollout.n=4", "critic.ppo_micro_batch_size_per_gpu=2",
              "reward_model.micro_batch_size_per_gpu=2")
    typed = typed_ppo_config(cfg)
    for prefix in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref", "critic",
                   "reward_model"):
        sizes = normalized_batch_sizes(attrgetter(prefix)(typed), rollout_n=4, dp_size=2, prefix=prefix + ".")
        assert sizes == normalized_batch_sizes(OmegaConf.select(cfg, prefix), rollout_n=4, dp_size=2,
                                               prefix=prefix + "."), prefix
    rollout = normalized_batch_sizes(typed.actor_rollout_ref.rollout, rollout_n=4, dp_size=2)
    assert rollout.ppo_mini_batch_size is None and rollout.log_prob_micro_batch_size_per_gpu == 2
    assert normalized_batch_sizes(typed.critic, rollout_n=4, dp_size=2).forward_micro_batch_size_per_gpu == 2
