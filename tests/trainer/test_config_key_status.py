"""No key is silently ignored: every leaf key of every shipped yaml, set to a non-default value of the right type,
is either refused before workers start (a ConfigError naming the key) or classified as honoured in the schema and
read by the code the schema names (``read_in``)."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

from tests.trainer.validator_assets import write_validator_assets
from verl.trainer.config_schema import validate_ppo_config
from verl.trainer import main_eval, main_generation, sft_trainer
from verl.trainer.config_schema.catalog import SHIPPED
from verl.trainer.config_schema.spec import KeySpec, _leaf_paths, accepted, check_value, specs
from verl.trainer.sft.config import validate_sft_config
from verl.utils.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")


def _compose(name: str, overrides=()) -> DictConfig:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def _yaml_leaves(name: str, schema: type) -> list[str]:
    table = specs(schema)
    sections = {p.rsplit(".", i)[0] for p in table for i in range(1, p.count(".") + 1)}
    free = [p for p, s in table.items() if s.free_form]  # a free-form mapping's own keys are the user's
    return [p for p in _leaf_paths(_compose(name)) if p not in sections and not p.startswith("hydra")
            and not any(p.startswith(f + ".") for f in free)]


LEAVES = {y.name: _yaml_leaves(y.name, y.schema) for y in SHIPPED}
# ppo_megatron_trainer.yaml is ppo_trainer.yaml plus the megatron keys: only what it adds or changes is probed again
CASES = [(y.name, path) for y in SHIPPED for path in LEAVES[y.name]
         if y.name != "ppo_megatron_trainer" or path not in LEAVES["ppo_trainer"] or path in y.defaults]


def _candidates(spec: KeySpec) -> list:
    """Non-default values of the key's type, nearest to its range first."""
    kinds, out = spec.kinds, []
    if spec.choices is not None:
        out += [c for c in spec.choices if c is not None]
    if bool in kinds:
        out += [True, False]
    if int in kinds or float in kinds:
        base = spec.default if isinstance(spec.default, (int, float)) and not isinstance(spec.default, bool) else 0
        lo = spec.ge if spec.ge is not None else spec.gt if spec.gt is not None else None
        nums = [base + 1, base + 2, 2, 3, 1]
        if lo is not None:
            nums += [lo + 1, lo + 2]
        if float in kinds and int not in kinds:
            nums = [base * 0.5 if base else 0.5, 0.5, 0.25, 0.9, 1.5] + nums
        out += nums
    if list in kinds:
        out += [[spec.items[-1]]] if spec.items else [[0.8, 0.9], ["probe"]]
    if str in kinds and spec.choices is None:
        out.append("probe-value")
    if dict in kinds or not kinds:
        out.append({"probe": 1})
    return out


def _probe(spec: KeySpec, want_refused: bool):
    for value in _candidates(spec):
        if value == spec.default or (isinstance(value, list) and value == spec.default):
            continue
        try:
            check_value(spec, value)
        except ConfigError:
            continue
        if want_refused == (spec.unsupported is not None and not accepted(spec, value)):
            return value
    raise AssertionError(f"no probe value for {spec.path} (default {spec.default!r})")


@functools.lru_cache(maxsize=None)
def _read(path: str) -> str:
    target = REPO / path
    files = sorted(target.rglob("*.py")) if path.endswith("/") else [target]
    return "\n".join(f.read_text() for f in files if f.exists())


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    write_validator_assets(root)
    return root


@pytest.fixture(scope="module")
def bases(assets):
    """A config of each yaml that passes validation (files exist, batch sizes divide)."""
    data = [f"data.train_files={assets / 'train.parquet'}", f"data.val_files={assets / 'train.parquet'}"]
    ppo = data + [
        f"actor_rollout_ref.model.path={assets / 'model'}", f"critic.model.path={assets / 'model'}",
        "actor_rollout_ref.rollout.name=hf", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=2", "trainer.logger=console",
    ]
    fsdp = ["actor_rollout_ref.actor.strategy=fsdp", "critic.strategy=fsdp", "reward_model.strategy=fsdp"]
    return {"ppo_trainer": _compose("ppo_trainer", ppo), "ppo_megatron_trainer": _compose("ppo_megatron_trainer", ppo + fsdp),
            "sft_trainer": _compose("sft_trainer", data),
            "sft_trainer_engine": _compose("sft_trainer_engine", data + [f"model.path={assets / 'model'}"]),
            "generation": _compose("generation", [f"data.path={assets / 'train.parquet'}", f"model.path={assets / 'model'}",
                                                  f"data.output_path={assets / 'out.parquet'}"]),
            "evaluation": _compose("evaluation")}


def _validate(name: str, cfg: DictConfig) -> None:
    if name.startswith("ppo"):
        validate_ppo_config(cfg)
    elif name == "sft_trainer":
        validate_sft_config(cfg, 1, "cpu")
    elif name == "sft_trainer_engine":
        sft_trainer.prepare(cfg, 1)
    elif name == "generation":
        main_generation.validate_generation_config(cfg)
    else:
        main_eval.run_eval(cfg)  # refuses no-effect keys before it reads data.path


def test_every_base_config_passes(bases):
    for name, cfg in bases.items():
        if name != "evaluation":  # main_eval validates while it scores (its no-effect check is tested per key)
            _validate(name, copy.deepcopy(cfg))


@pytest.mark.parametrize("schema_name, table", [("generation", main_generation._NO_EFFECT),
                                                ("evaluation", main_eval._NO_EFFECT)])
def test_offline_schemas_match_the_entry_points(schema_name, table):
    """The keys main_generation / main_eval refuse are exactly the schema's default-only keys."""
    schema = next(y.schema for y in SHIPPED if y.name == schema_name)
    assert {p for p, s in specs(schema).items() if not s.honoured} == set(table)


@pytest.mark.parametrize("yaml_name, path", CASES)
def test_key_is_honoured_or_refused(bases, yaml_name, path):
    schema = next(y.schema for y in SHIPPED if y.name == yaml_name)
    spec = specs(schema).get(path)
    assert spec is not None, f"{yaml_name}.yaml: {path} is not in the schema ({schema.__name__})"
    if spec.honoured:
        assert spec.read_in, f"{path} is honoured but names no reader (read_in)"
        value = _probe(spec, want_refused=False)
        check_value(spec, value)  # a non-default value of the right type passes the key's own checks
        leaf = path.rsplit(".", 1)[-1]
        pattern = re.compile(r"""["'.]""" + re.escape(leaf) + r"\b")
        assert any(pattern.search(_read(p)) for p in spec.read_in), \
            f"{path} is classified honoured, but '{leaf}' is not read in {spec.read_in}: update the schema's read_in " \
            "to where the key is read, or classify it as unsupported"
    elif spec.inert is not None:  # no effect: a non-default value is accepted
        value = _probe(spec, want_refused=False)
        cfg = copy.deepcopy(bases[yaml_name])
        with open_dict(cfg):
            OmegaConf.update(cfg, path, value, force_add=True, merge=False)
        _validate(yaml_name, cfg)
    else:
        value = _probe(spec, want_refused=True)
        cfg = copy.deepcopy(bases[yaml_name])
        with open_dict(cfg):
            OmegaConf.update(cfg, path, value, force_add=True, merge=False)
        with pytest.raises(ConfigError) as err:
            _validate(yaml_name, cfg)
        assert path in str(err.value), f"{path}={value!r} was refused, but the message does not name it: {err.value}"


def test_cases_cover_every_yaml():
    counts = {y.name: sum(1 for n, _ in CASES if n == y.name) for y in SHIPPED}
    assert counts["ppo_trainer"] > 350 and counts["ppo_megatron_trainer"] >= 14
    assert set(LEAVES["ppo_trainer"]) < set(LEAVES["ppo_megatron_trainer"])
    assert counts["sft_trainer"] > 55 and counts["generation"] > 40 and counts["evaluation"] >= 9
    assert counts["sft_trainer_engine"] > 100
