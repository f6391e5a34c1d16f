"""``--check-config`` on the SFT trainer and the recipes' entry points (main_ppo has its own tests).

For each entry point: a good command line prints ``config ok`` and exits 0; a bad one prints a ``Config error:``
line naming the key and exits 2. Neither starts Ray or a process group, and neither writes anything: the output
directory named on the command line is not created, nor is anything else in the working directory.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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


# entry point -> (good overrides, a bad override, the key its error must name); the output directory is added below
ENTRY_POINTS = {
    "verl.trainer.fsdp_sft_trainer": (_sft, "optim.clip_grad=-1", "optim.clip_grad"),
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


def _check(module: str, args: list[str], cwd: Path):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", RAY_ADDRESS="")  # no cluster to join: a Ray start would be local
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-m", module, "--check-config", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def _no_output(cwd: Path, out: Path, proc) -> None:
    assert not out.exists(), f"--check-config created {out}"
    assert sorted(p.name for p in cwd.iterdir()) == [], f"--check-config wrote {list(cwd.iterdir())}"
    assert "Started a local Ray instance" not in proc.stdout + proc.stderr
    assert "ray.init" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_check_config_good_and_bad(module, assets, tmp_path):
    good, bad, names = ENTRY_POINTS[module]
    out = tmp_path / "out"
    args = [*good(assets), f"trainer.default_local_dir={out}"]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    ok = _check(module, args, cwd)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stdout.strip().splitlines()[-1] == "config ok"
    _no_output(cwd, out, ok)

    refused = _check(module, [*args, bad], cwd)
    assert refused.returncode == 2, (refused.stdout[-2000:], refused.stderr[-3000:])
    errors = [ln for ln in refused.stderr.splitlines() if ln.startswith("Config error:")]
    assert errors and names in errors[-1], refused.stderr[-3000:]
    assert "config ok" not in refused.stdout
    _no_output(cwd, out, refused)


def test_sft_check_config_counts_torchrun_processes(assets, tmp_path):
    """The number of processes is torchrun's WORLD_SIZE: sequence parallel 2 needs 2 processes."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    args = [*_sft(assets), "ulysses_sequence_parallel_size=2", "use_remove_padding=true",
            f"trainer.default_local_dir={tmp_path / 'out'}"]
    one = _check("verl.trainer.fsdp_sft_trainer", args, cwd)
    assert one.returncode == 2 and "ulysses_sequence_parallel_size=2 must divide the number of processes (1" in one.stderr
    env_args = ["env", "WORLD_SIZE=2", sys.executable, "-m", "verl.trainer.fsdp_sft_trainer", "--check-config", *args]
    two = subprocess.run(env_args, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1"),
                         capture_output=True, text=True, timeout=240)
    assert two.returncode == 0 and two.stdout.strip().endswith("config ok"), two.stderr[-2000:]
    _no_output(cwd, tmp_path / "out", two)
