"""``--check-config`` on the SFT trainers (both layouts) and the recipes' entry points (main_ppo has its own tests).

Every entry point has ``check_command_line(argv)``, the function the flag runs. For each one, in this process: a good
command line passes and a bad one raises ConfigError naming the key; neither starts Ray or a process group, and
neither writes anything (the output directory named on the command line is not created, nor is anything else in the
working directory).

The command-line wiring itself (``python -m <module> --check-config ...`` prints ``config ok`` and exits 0, or a
``Config error:`` line naming the key and exits 2) is checked for the SFT trainer, one ``run_recipe`` recipe (DPO)
and DAPO, all in one child interpreter that runs each module as ``__main__`` the way ``python -m`` does: starting an
interpreter (importing torch, transformers, Hydra) is what costs, so it is paid once.
"""

import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray
import torch.distributed as dist

from verl.utils.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
# the recipes' __main__ silences Hydra's false alarm about pkg://verl.trainer.config (quiet_searchpath_warning)
pytestmark = pytest.mark.filterwarnings(r"ignore:.*path=verl\.trainer\.config is not available")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny model (and a second one as GKD's teacher), RL prompts, SFT rows and preference pairs."""
    import pandas as pd

    from verl.utils.dataset.preprocess_utils import write_parquet
    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import ArithmeticConfig, make_rl_rows, make_sft_rows
    from verl.utils.embedded.preferences import write_preference_files

    root = tmp_path_factory.mktemp("check_config_assets")
    cfg = ArithmeticConfig(max_digits=1)
    pd.DataFrame(make_sft_rows(32, "train", seed=0, config=cfg)).to_parquet(root / "sft.parquet")
    pref = write_preference_files(str(root / "pref"), n_train=16, n_test=8, config=cfg)
    return {
        "model": make_model_dir(str(root / "model"), size="tiny", seed=0),
        "teacher": make_model_dir(str(root / "teacher"), size="tiny", seed=1),
        "rl_train": write_parquet(make_rl_rows(32, "train", seed=0, config=cfg), str(root / "rl_train.parquet")),
        "rl_test": write_parquet(make_rl_rows(16, "test", seed=1, config=cfg), str(root / "rl_test.parquet")),
        "sft": str(root / "sft.parquet"), "pref_train": pref["train"], "pref_test": pref["test"],
    }


def _rl(a):
    return [f"data.train_files={a['rl_train']}", f"data.val_files={a['rl_test']}",
            f"actor_rollout_ref.model.path={a['model']}"]


def _pref(a):
    return [f"data.train_files={a['pref_train']}", f"data.val_files={a['pref_test']}",
            f"actor_rollout_ref.model.path={a['model']}", "data.train_batch_size=8"]


def _sft(a):
    # verl's gsm8k SFT scripts add the dict keys with '+' (the key is null in the yaml, so Hydra accepts it)
    return [f"data.train_files={a['sft']}", "data.val_files=null", f"model.partial_pretrain={a['model']}",
            "data.prompt_key=prompt", "data.response_key=response", "+data.response_dict_keys=null",
            "data.train_batch_size=8", "data.micro_batch_size_per_gpu=2"]


def _sft_engine(a):
    # verl 0.7's layout (sft_trainer_engine.yaml): rows are message lists, read at run time, not by the check
    return [f"data.train_files={a['sft']}", f"model.path={a['model']}", "data.train_batch_size=8"]


# entry point -> (good overrides, a bad override, the key its error must name); the output directory is added below
ENTRY_POINTS = {
    "verl.trainer.fsdp_sft_trainer": (_sft, "optim.clip_grad=-1", "optim.clip_grad"),
    "verl.trainer.sft_trainer": (_sft_engine, "engine.fsdp_size=0", "engine.fsdp_size"),
    "recipe.dpo.main_dpo": (_pref, "dpo.micro_batch_size_per_gpu=3", "dpo.micro_batch_size_per_gpu"),
    "recipe.simpo.main_simpo": (_pref, "simpo.micro_batch_size_per_gpu=3", "simpo.micro_batch_size_per_gpu"),
    "recipe.reward_model.main_reward_model": (_pref, "data.train_batch_size=1000", "data.train_batch_size"),
    "recipe.spin.main_spin": (_pref, "data.train_batch_size=1000", "data.train_batch_size"),
    "recipe.online_dpo.main_online_dpo": (_rl, "actor_rollout_ref.actor.optim.learning_rate=1",
                                          "actor_rollout_ref.actor.optim.learning_rate"),  # a typo: Hydra refuses it
    "recipe.sppo.main_sppo": (_rl, "data.train_batch_size=1000", "data.train_batch_size"),
    "recipe.rejection_sampling.main_rejection_sampling": (_rl, "data.train_batch_size=1000", "data.train_batch_size"),
    "recipe.gkd.main_gkd": (lambda a: [*_rl(a), f"actor_rollout_ref.teacher.model.path={a['teacher']}"],
                            "actor_rollout_ref.teacher.model.path=/nonexistent/teacher",
                            "/nonexistent/teacher"),
    "recipe.dapo.main_dapo": (lambda a: [*_rl(a), "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1",
                                         "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                                         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                                         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
                                         "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"],
                              "data.gen_batch_size=4", "data.gen_batch_size"),
}
# checked through the real command line as well: the SFT trainer, a run_recipe recipe and DAPO each wire the flag
CLI_ENTRY_POINTS = ("verl.trainer.fsdp_sft_trainer", "recipe.dpo.main_dpo", "recipe.dapo.main_dapo")


# ------------------------------------------------------------------------------------------------ in process
@dataclass
class Sandbox:
    cwd: Path  # the working directory during the check: must stay empty
    out: Path  # trainer.default_local_dir: must not be created
    started: list  # calls to ray.init / init_process_group made during the check
    ray_was_up: bool

    def assert_nothing_started_or_written(self) -> None:
        assert not self.started, f"--check-config started {self.started}"
        assert ray.is_initialized() is self.ray_was_up, "--check-config initialised Ray"
        assert not dist.is_initialized(), "--check-config initialised a process group"
        assert not self.out.exists(), f"--check-config created {self.out}"
        assert sorted(p.name for p in self.cwd.iterdir()) == [], f"--check-config wrote {list(self.cwd.iterdir())}"


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """An empty working directory; Ray and torch.distributed starts recorded (and refused); the environment as a
    plain ``python -m`` would see it, restored afterwards (the checks may set variables such as VERL_DEVICE)."""
    saved_env = dict(os.environ)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    os.environ.pop("WORLD_SIZE", None)
    os.environ.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RAY_ADDRESS="")
    started = []

    def refuse(what):
        def call(*args, **kwargs):
            started.append(what)
            raise RuntimeError(f"--check-config must not call {what}")
        return call

    monkeypatch.setattr(ray, "init", refuse("ray.init"))
    monkeypatch.setattr(dist, "init_process_group", refuse("torch.distributed.init_process_group"))
    assert not dist.is_initialized()
    yield Sandbox(cwd=cwd, out=tmp_path / "out", started=started, ray_was_up=ray.is_initialized())
    os.environ.clear()
    os.environ.update(saved_env)


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_check_command_line_good_and_bad(module, assets, sandbox):
    good, bad, names = ENTRY_POINTS[module]
    check = importlib.import_module(module).check_command_line
    args = [*good(assets), f"trainer.default_local_dir={sandbox.out}"]
    check(args)
    sandbox.assert_nothing_started_or_written()

    with pytest.raises(ConfigError) as refused:
        check([*args, bad])
    assert names in str(refused.value)
    sandbox.assert_nothing_started_or_written()


def test_sft_check_counts_torchrun_processes(assets, sandbox):
    """The number of processes is torchrun's WORLD_SIZE: sequence parallel 2 needs 2 processes."""
    from verl.trainer.fsdp_sft_trainer import check_command_line

    args = [*_sft(assets), "ulysses_sequence_parallel_size=2", "use_remove_padding=true",
            f"trainer.default_local_dir={sandbox.out}"]
    with pytest.raises(ConfigError) as one:
        check_command_line(args)
    assert "ulysses_sequence_parallel_size=2 must divide the number of processes (1" in str(one.value)
    os.environ["WORLD_SIZE"] = "2"  # what torchrun --nproc_per_node 2 sets (the sandbox restores the environment)
    check_command_line(args)
    sandbox.assert_nothing_started_or_written()


# ------------------------------------------------------------------------------------------------ command line
# Runs each case's module as __main__ with sys.argv = [module, --check-config, *args] (what ``python -m`` does) in
# the case's working directory; records the exit code, the output and whether Ray / a process group came up.
_CLI_DRIVER = r"""
import contextlib, io, json, os, runpy, sys, traceback

import ray

cases_file, results_file = sys.argv[1:]
results = []
for case in json.loads(open(cases_file).read()):
    os.chdir(case["cwd"])
    sys.argv = [case["module"], "--check-config", *case["args"]]
    out, err, code = io.StringIO(), io.StringIO(), "returned"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(case["module"], run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = "raised"
    dist = sys.modules.get("torch.distributed")
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "ray": ray.is_initialized(),
                    "process_group": bool(dist is not None and dist.is_available() and dist.is_initialized())})
open(results_file, "w").write(json.dumps(results))
"""


def test_check_config_command_line(assets, tmp_path):
    cases, outs = [], []
    for i, module in enumerate(CLI_ENTRY_POINTS):
        good, bad, names = ENTRY_POINTS[module]
        cwd, out = tmp_path / f"cwd{i}", tmp_path / f"out{i}"
        cwd.mkdir()
        args = [*good(assets), f"trainer.default_local_dir={out}"]
        cases += [{"module": module, "args": args, "cwd": str(cwd)},
                  {"module": module, "args": [*args, bad], "cwd": str(cwd), "names": names}]
        outs += [out, out]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", RAY_ADDRESS="")  # no cluster to join: a Ray start would be local
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-c", _CLI_DRIVER, str(tmp_path / "cases.json"),
                           str(tmp_path / "results.json")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results) == len(cases)

    for case, out, res in zip(cases, outs, results):
        label = f"{case['module']} {'bad' if 'names' in case else 'good'}: {res['stderr'][-3000:]}"
        if "names" not in case:
            assert res["code"] == 0, label
            assert res["stdout"].strip().splitlines()[-1] == "config ok", label
        else:
            assert res["code"] == 2, label
            errors = [ln for ln in res["stderr"].splitlines() if ln.startswith("Config error:")]
            assert errors and case["names"] in errors[-1], label
            assert "config ok" not in res["stdout"], label
        assert not res["ray"] and not res["process_group"], label
        assert "Started a local Ray instance" not in res["stdout"] + res["stderr"], label
        assert not out.exists(), f"{label}: --check-config created {out}"
        assert sorted(p.name for p in Path(case["cwd"]).iterdir()) == [], f"{label}: --check-config wrote something"
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
