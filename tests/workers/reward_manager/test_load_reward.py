import textwrap

import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.config_schema.ppo import PPOTrainerConfig
from verl.trainer.config_schema.spec import build, specs
from verl.trainer.ppo.reward import compute_reward, get_custom_reward_fn, load_reward_manager
from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager import (BatchRewardManager, DAPORewardManager, NaiveRewardManager,
                                         PrimeRewardManager)

CUSTOM = textwrap.dedent('''
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
        return scale * float(solution_str.strip() == str(ground_truth))

    def with_info(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 2.0, "length": len(solution_str)}

    NOT_A_FUNCTION = 3
''')


def make_config(**overrides):
    base = {
        "data": {"reward_fn_key": "data_source", "max_response_length": 20},
        "reward_model": {"reward_manager": "naive", "reward_kwargs": {}},
        "reward_manager": {"source": "register", "name": None, "module": {"path": None, "name": "custom_reward_manager"}},
        "custom_reward_function": {"path": None, "name": "compute_score"},
    }
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides))


@pytest.fixture
def custom_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM)
    return str(path)


def test_no_custom_path_gives_none():
    assert get_custom_reward_fn(make_config()) is None


def test_custom_function_loaded_by_path_with_kwargs(custom_file):
    fn = get_custom_reward_fn(make_config(custom_reward_function={"path": custom_file}))
    assert fn("any", " yes ", "yes") == 1.0 and fn("any", "no", "yes") == 0.0
    cfg = make_config(custom_reward_function={"path": custom_file, "reward_kwargs": {"scale": 3.0}})
    assert get_custom_reward_fn(cfg)("any", "yes", "yes") == 3.0
    named = get_custom_reward_fn(make_config(custom_reward_function={"path": custom_file, "name": "with_info"}))
    assert named("d", "abc", "x") == {"score": 2.0, "length": 3}


def test_custom_missing_file_names_the_file(tmp_path):
    missing = str(tmp_path / "nope.py")
    with pytest.raises(FileNotFoundError) as err:
        get_custom_reward_fn(make_config(custom_reward_function={"path": missing}))
    assert "nope.py" in str(err.value) and "custom_reward_function.path" in str(err.value)


def test_custom_missing_function_names_file_and_function(custom_file):
    with pytest.raises(AttributeError) as err:
        get_custom_reward_fn(make_config(custom_reward_function={"path": custom_file, "name": "score_it"}))
    msg = str(err.value)
    assert "'score_it'" in msg and "my_reward.py" in msg and "compute_score" in msg and "with_info" in msg
    with pytest.raises(TypeError, match="NOT_A_FUNCTION"):
        get_custom_reward_fn(make_config(custom_reward_function={"path": custom_file, "name": "NOT_A_FUNCTION"}))


@pytest.mark.parametrize("overrides,cls", [
    ({}, NaiveRewardManager),
    ({"reward_model": {"reward_manager": "batch"}}, BatchRewardManager),
    ({"reward_manager": {"name": "prime"}}, PrimeRewardManager),
    ({"reward_model": {"reward_manager": "dapo"}, "reward_manager": {"name": "naive"}}, DAPORewardManager),
])
def test_load_reward_manager_picks_class(char_tokenizer, overrides, cls):
    mgr = load_reward_manager(make_config(**overrides), char_tokenizer, num_examine=0)
    assert type(mgr) is cls
    assert mgr.reward_fn_key == "data_source"
    if cls is not BatchRewardManager:
        assert mgr.compute_score is default_compute_score


def test_load_reward_manager_errors(char_tokenizer):
    with pytest.raises(ValueError, match="Registered"):
        load_reward_manager(make_config(reward_model={"reward_manager": "fancy"}), char_tokenizer, 0)
    with pytest.raises(ValueError, match="disagree"):
        load_reward_manager(make_config(reward_model={"reward_manager": "prime"}, reward_manager={"name": "dapo"}),
                            char_tokenizer, 0)


def test_load_reward_manager_importlib_source(char_tokenizer, tmp_path):
    path = tmp_path / "my_manager.py"
    path.write_text(textwrap.dedent('''
        from verl.workers.reward_manager import NaiveRewardManager

        class custom_reward_manager(NaiveRewardManager):
            pass
    '''))
    cfg = make_config(reward_manager={"source": "importlib", "module": {"path": str(path)}})
    mgr = load_reward_manager(cfg, char_tokenizer, 0)
    assert type(mgr).__name__ == "custom_reward_manager" and isinstance(mgr, NaiveRewardManager)


def test_keys_left_out_have_the_schema_defaults_and_a_typed_config_is_read_as_is(char_tokenizer, custom_file):
    cfg = OmegaConf.create({"custom_reward_function": {"path": custom_file},
                            "reward_model": {"reward_manager": "dapo"}})
    mgr = load_reward_manager(cfg, char_tokenizer, 0)
    defaults = specs(PPOTrainerConfig)
    assert type(mgr) is DAPORewardManager and mgr.reward_fn_key == defaults["data.reward_fn_key"].default
    assert mgr.max_resp_len == defaults["data.max_response_length"].default
    assert mgr.compute_score.name == defaults["custom_reward_function.name"].default
    typed = build(PPOTrainerConfig, make_config(reward_model={"reward_manager": "batch"},
                                                custom_reward_function={"path": custom_file}))
    assert type(load_reward_manager(typed, char_tokenizer, 0)) is BatchRewardManager
    assert get_custom_reward_fn(typed)("any", "yes", "yes") == 1.0


def test_dapo_kwargs_from_config(char_tokenizer):
    cfg = make_config(reward_model={"reward_manager": "dapo", "overlong_buffer": {"enable": True, "len": 4,
                                                                                   "penalty_factor": 1.0}})
    mgr = load_reward_manager(cfg, char_tokenizer, 0)
    assert mgr.max_resp_len == 20 and mgr.overlong_buffer_cfg["len"] == 4
    cfg = make_config(reward_model={"reward_manager": "dapo", "reward_kwargs": {
        "max_resp_len": 16, "overlong_buffer_cfg": {"enable": True, "len": 2, "penalty_factor": 0.5}}})
    mgr = load_reward_manager(cfg, char_tokenizer, 0)
    assert mgr.max_resp_len == 16 and mgr.overlong_buffer_cfg["len"] == 2


def test_end_to_end_custom_reward_and_compute_reward(char_tokenizer, make_batch, custom_file, response_lengths):
    rows = [("Q", "yes", "my/data", "yes"), ("Q", "no", "my/data", "yes")]
    data = make_batch(rows)
    cfg = make_config(custom_reward_function={"path": custom_file, "reward_kwargs": {"scale": 2.0}})
    mgr = load_reward_manager(cfg, char_tokenizer, num_examine=0)
    reward, extra = compute_reward(data, mgr)
    lens = response_lengths(rows)
    assert reward[0, lens[0] - 1].item() == 2.0 and reward.sum().item() == 2.0
    assert extra == {}

    cfg = make_config(custom_reward_function={"path": custom_file, "name": "with_info"})
    reward, extra = compute_reward(data, load_reward_manager(cfg, char_tokenizer, 0))
    assert extra["length"] == [3, 2] and reward.sum().item() == 4.0

    # a plain callable without return_dict works too
    reward, extra = compute_reward(data, lambda d: torch.ones(2, 3))
    assert reward.shape == (2, 3) and extra == {}


def test_custom_function_pickles_by_path(custom_file):
    import pickle
    import sys

    fn = get_custom_reward_fn(make_config(custom_reward_function={"path": custom_file, "reward_kwargs": {"scale": 5.0}}))
    blob = pickle.dumps(fn)
    for name in [m for m in sys.modules if m.startswith("verl_custom_my_reward")]:
        del sys.modules[name]  # as in a fresh Ray worker that never imported the file
    clone = pickle.loads(blob)
    assert clone("d", "yes", "yes") == 5.0 and clone("d", "yes", "yes", scale=1.0) == 1.0


def test_docs_example_runs(char_tokenizer, make_batch, tmp_path):
    """The example in docs/custom_reward.md works as written."""
    import pathlib
    import re

    doc = (pathlib.Path(__file__).parents[3] / "docs" / "custom_reward.md").read_text()
    example = re.search(r"```python\n(# my_reward.py.*?)```", doc, re.DOTALL).group(1)
    path = tmp_path / "my_reward.py"
    path.write_text(example)
    cfg = make_config(custom_reward_function={"path": str(path), "reward_kwargs": {"bonus": 0.1}})
    data = make_batch([("Q", "<answer>42</answer>", "any", "42"), ("Q", "42", "any", "42")])
    reward, extra = compute_reward(data, load_reward_manager(cfg, char_tokenizer, 0))
    assert reward.sum().item() == pytest.approx(1.2)
    assert extra["acc"] == [True, False] and extra["has_answer"] == [True, False]


@pytest.mark.parametrize("manager", ["naive", "batch"])
def test_sandbox_fusion_url_scores_code_rows_on_the_server(char_tokenizer, make_batch, response_lengths, manager):
    """reward_model.sandbox_fusion.url: the code data sources' programs run on that server (its memory limit
    sent along); other data sources are scored as before."""
    import json

    from tests.utils.reward_score.sandbox_server import running_sandbox

    cases = json.dumps({"inputs": ["2\n", "-3\n"], "outputs": ["4\n", "-6\n"]})
    rows = [("Q", "```python\nprint(int(input())*2)\n```", "codecontests", cases),
            ("Q", "```python\nprint(abs(int(input()))*2)\n```", "codeforces", cases),
            ("Q", "7", "arithmetic", "7")]
    data = make_batch(rows, resp_len=48)
    with running_sandbox() as (url, handler):
        cfg = make_config(reward_model={"reward_manager": manager, "reward_kwargs": {},
                                        "sandbox_fusion": {"url": url, "max_concurrent": 4, "memory_limit_mb": 512}})
        reward, extra = compute_reward(data, load_reward_manager(cfg, char_tokenizer, num_examine=0))
    lens = response_lengths(rows, resp_len=48)
    assert [reward[i, lens[i] - 1].item() for i in range(3)] == [1.0, 0.5, 1.0]
    assert len(handler.requests) == 4 and {r["memory_limit_MB"] for r in handler.requests} == {512}
    assert extra["passed"][:2] == [2, 1]
