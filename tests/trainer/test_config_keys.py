"""Every key of verl's config (shared/design/CONFIG_KEYS.md) is present in ppo_trainer.yaml with its default."""

import ast
import os
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")
# documented deviations from verl's defaults (reason in ppo_trainer.yaml)
DEVIATIONS = {"trainer.device": "auto"}
PPO_SECTIONS = {"data", "actor_rollout_ref", "critic", "reward_model", "reward_manager", "custom_reward_function",
                "algorithm", "trainer"}


# A copy of the team's key list (shared/design/CONFIG_KEYS.md) lives in the repo so that the contract is
# checked from any clone; test_vendored_key_list_is_current keeps the copy honest where shared/ exists.
VENDORED = REPO / "tests" / "trainer" / "data" / "config_keys.md"
SHARED = REPO.parent / "shared" / "design" / "CONFIG_KEYS.md"


def _keys_file():
    return VENDORED


def test_vendored_key_list_is_current():
    if not SHARED.exists():
        pytest.skip("no shared/design/CONFIG_KEYS.md beside this clone to compare the vendored copy with")
    assert VENDORED.read_text() == SHARED.read_text(), "refresh tests/trainer/data/config_keys.md from shared/design"


def _parse_keys(text):
    """[(key, raw_value)] for the PPO sections (sft_trainer.yaml's section is someone else's file)."""
    rows, section = [], None
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        m = re.match(r"^([A-Za-z_][\w.]*) = (.*)$", line)
        if m and section in PPO_SECTIONS:
            rows.append((m.group(1), m.group(2).strip()))
    return rows


@pytest.fixture(scope="module")
def cfg():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer")


def _expected(cfg, key, raw):
    """The value CONFIG_KEYS.md promises, evaluated against our composed config."""
    m = re.match(r"^\(follows ([^;)]+)(?:; else (.*))?\)$", raw)
    if m:
        src, fallback = m.group(1).strip(), m.group(2)
        if src.startswith("."):
            src = key.rsplit(".", 1)[0] + src
        value = OmegaConf.select(cfg, src, default="__absent__")
        if value != "__absent__":
            return value
        return _literal(fallback)
    if raw.startswith("checkpoints/{"):
        return raw.replace("{trainer.project_name}", cfg.trainer.project_name).replace(
            "{trainer.experiment_name}", cfg.trainer.experiment_name)
    return _literal(raw)


def _literal(raw):
    raw = raw.strip()
    if raw in ("null", "None"):
        return None
    if raw in ("true", "false"):
        return raw == "true"
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw.strip('"')


def test_every_documented_key_has_its_default(cfg):
    path = _keys_file()
    rows = _parse_keys(path.read_text())
    assert len(rows) > 250, f"parsed only {len(rows)} keys from {path}"
    problems = []
    for key, raw in rows:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if node is None or leaf not in node.keys():
            problems.append(f"missing: {key}")
            continue
        if raw == "'???'":
            if not OmegaConf.is_missing(node, leaf):
                problems.append(f"{key}: expected mandatory '???'")
            continue
        actual = OmegaConf.select(cfg, key)
        if isinstance(actual, (type(OmegaConf.create([])),)):
            actual = list(actual)
        expected = DEVIATIONS.get(key, _expected(cfg, key, raw))
        if isinstance(expected, tuple):
            expected = list(expected)
        if actual != expected or type(actual) is bool and type(expected) is not bool:
            problems.append(f"{key}: {actual!r} != documented {expected!r} (raw {raw})")
    assert not problems, "\n".join(problems)


def test_interpolations_follow_their_source():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[
            "actor_rollout_ref.rollout.n=4", "data.max_prompt_length=64", "actor_rollout_ref.actor.ppo_epochs=3",
            "trainer.project_name=p", "trainer.experiment_name=e", "critic.ppo_micro_batch_size_per_gpu=2",
        ])
    assert cfg.actor_rollout_ref.actor.rollout_n == 4
    assert cfg.critic.rollout_n == 4
    assert cfg.actor_rollout_ref.rollout.prompt_length == 64
    assert cfg.critic.ppo_epochs == 3
    assert cfg.critic.forward_micro_batch_size_per_gpu == 2
    assert cfg.trainer.default_local_dir == "checkpoints/p/e"


def test_no_hydra_outputs_configured(cfg):
    # composing through @hydra.main must not create outputs/ or .hydra/ in the user's directory
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        full = compose(config_name="ppo_trainer", return_hydra_config=True)
    assert full.hydra.output_subdir is None
    assert full.hydra.run.dir == "."
    assert full.hydra.job.chdir is False
    assert full.hydra.job_logging == {} or "handlers" not in full.hydra.job_logging or not full.hydra.job_logging.handlers


def test_other_entry_configs_compose():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        gen = compose(config_name="generation")
        ev = compose(config_name="evaluation")
        meg = compose(config_name="ppo_megatron_trainer")
    assert gen.rollout.n == 1 and gen.data.n_samples == 5 and gen.trainer.device == "auto"
    assert ev.data.response_key == "responses" and ev.custom_reward_function.name == "compute_score"
    assert meg.actor_rollout_ref.actor.strategy == "megatron"
    assert meg.actor_rollout_ref.ref.strategy == "megatron"  # follows the actor
    assert meg.data.train_batch_size == 1024  # everything else is ppo_trainer.yaml
