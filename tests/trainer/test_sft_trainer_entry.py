"""``python -m verl.trainer.sft_trainer``: verl 0.7's engine layout of SFT (sft_trainer_engine.yaml) on the SFT
trainer of verl.trainer.fsdp_sft_trainer. Its config (verl's groups, keys and defaults), ``--check-config`` (good
and bad command lines, refusals by name, nothing written), and one end-to-end run that lowers the loss and saves."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from verl.utils.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")
PY = sys.executable


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """The tiny model and arithmetic problems as chat message rows (train, test), plus a file with an image column."""
    import pandas as pd

    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import ArithmeticConfig, make_sft_rows

    root = tmp_path_factory.mktemp("sft_entry_assets")
    cfg = ArithmeticConfig(min_digits=1, max_digits=1, operators="+-")

    def chats(rows):
        return [{"messages": [{"role": "user", "content": r["prompt"]},
                              {"role": "assistant", "content": r["response"]}]} for r in rows]

    pd.DataFrame(chats(make_sft_rows(256, "train", seed=0, config=cfg))).to_parquet(root / "train.parquet")
    pd.DataFrame(chats(make_sft_rows(24, "test", seed=1, config=cfg))).to_parquet(root / "test.parquet")
    pd.DataFrame([dict(chats(make_sft_rows(1, seed=2, config=cfg))[0], images=[b""])]).to_parquet(root / "vlm.parquet")
    return {"train": str(root / "train.parquet"), "test": str(root / "test.parquet"), "vlm": str(root / "vlm.parquet"),
            "model": make_model_dir(str(root / "model"), size="tiny")}


def _good(a, out):
    return [f"data.train_files={a['train']}", f"data.val_files={a['test']}", f"model.path={a['model']}",
            "data.train_batch_size=16", "trainer.logger=console", f"trainer.default_local_dir={out}"]


# ------------------------------------------------------------------------------------------------ the yaml
def test_yaml_is_verls_layout_with_its_defaults():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="sft_trainer_engine")
    assert cfg.model.path == "~/models/deepseek-llm-7b-chat" and cfg.model.use_remove_padding is True
    assert cfg.engine.strategy == "fsdp" and cfg.engine.dtype == "bfloat16"
    assert cfg.engine.ulysses_sequence_parallel_size == 1 and cfg.engine.fsdp_size == -1
    assert cfg.optim.lr == 1e-3 and list(cfg.optim.betas) == [0.9, 0.999] and cfg.optim.lr_scheduler_type == "constant"
    assert cfg.data.use_dynamic_bsz is True and cfg.data.max_token_len_per_gpu == 8192 and cfg.data.val_files is None
    assert cfg.data.messages_key == "messages" and cfg.data.pad_mode == "no_padding"
    assert list(cfg.checkpoint.load_contents) == ["model", "optimizer", "extra"]
    assert list(cfg.trainer.profile_interval) == [-1, -1] and cfg.trainer.n_gpus_per_node == 1


# ------------------------------------------------------------------------------------------------ --check-config
@pytest.fixture
def check(tmp_path, monkeypatch):
    """``check_command_line`` in an empty working directory, with torchrun's WORLD_SIZE settable."""
    from verl.trainer.sft_trainer import check_command_line

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    def run(args, world_size=1):
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        return check_command_line(args)

    yield run
    assert list(tmp_path.iterdir()) == [], "--check-config wrote something"


def test_check_accepts_verls_vlm_script_settings(assets, check, tmp_path):
    """examples/sft/vlm/run_qwen3_vl_2b.sh's engine, optimizer and batch keys (8 processes, Ulysses 2)."""
    check([*_good(assets, tmp_path / "out"), "data.train_batch_size=96", "data.max_length=2048",
           "data.pad_mode=no_padding", "data.truncation=error", "data.use_dynamic_bsz=True",
           "data.max_token_len_per_gpu=65536", "model.use_remove_padding=True", "engine=fsdp", "optim=fsdp",
           "optim.lr=2e-5", "optim.lr_warmup_steps_ratio=0.01", "optim.weight_decay=0.1", "optim.betas=[0.9,0.95]",
           "optim.clip_grad=1.0", "optim.min_lr_ratio=0.1", "optim.warmup_style=cosine",
           "engine.ulysses_sequence_parallel_size=2", "engine.strategy=fsdp2", "engine.fsdp_size=-1",
           "trainer.test_freq=-1", "trainer.save_freq=4000", "trainer.total_epochs=10", "trainer.resume_mode=auto",
           "trainer.max_ckpt_to_keep=5", "checkpoint.save_contents=[model,optimizer,extra]"], world_size=8)
    # with dynamic batches no row count has to divide the batch; after_each_epoch is a frequency
    check([*_good(assets, tmp_path / "out"), "data.micro_batch_size_per_gpu=3", "trainer.save_freq=after_each_epoch"])


@pytest.mark.parametrize("overrides, world_size, message", [
    (["optim.clip_grad=-1"], 1, "optim.clip_grad=-1 must be a number >= 0"),
    (["optim.lr_scheduler=cosine"], 1, "did you mean 'optim.lr_scheduler_type'"),
    (["engine=megatron"], 1, "engine=megatron is not supported"),
    (["optim=veomni"], 1, "optim=veomni is not supported: the VeOmni engine is not available"),
    (["profiler.enable=true"], 1, "profiler.enable=True is not supported"),
    (["trainer.profile_interval=[1,2]"], 1, "trainer.profile_interval=[1, 2] is not supported"),
    (["model.use_liger=true"], 1, "model.use_liger=True is not supported"),
    (["engine.forward_only=true"], 1, "engine.forward_only=True is not supported: SFT trains the model"),
    (["trainer.save_freq=weekly"], 1, "trainer.save_freq='weekly' must be"),
    (["engine.fsdp_size=3"], 4, "engine.fsdp_size=3 must divide the number of processes (4"),
    # fixed row counts (no dynamic batches) must divide each process's rows
    (["data.use_dynamic_bsz=false", "data.micro_batch_size_per_gpu=6"], 1, "data.micro_batch_size_per_gpu=6"),
    # the checks shared with the older layout name this layout's keys
    (["engine.ulysses_sequence_parallel_size=2"], 1, "engine.ulysses_sequence_parallel_size=2 must divide"),
])
def test_check_refuses_by_name(assets, check, tmp_path, overrides, world_size, message):
    with pytest.raises(ConfigError) as err:
        check([*_good(assets, tmp_path / "out"), *overrides], world_size)
    assert message in str(err.value)


def test_check_names_this_layouts_keys_and_image_rows(assets, check, tmp_path):
    with pytest.raises(ConfigError) as sp:
        check([*_good(assets, tmp_path / "out"), "engine.ulysses_sequence_parallel_size=2",
               "model.use_remove_padding=false"], world_size=2)
    assert "engine.ulysses_sequence_parallel_size=2 needs model.use_remove_padding=true" in str(sp.value)
    with pytest.raises(ConfigError) as missing:
        check([*_good(assets, tmp_path / "out"), f"model.path={tmp_path / 'nope'}"])
    assert str(missing.value).startswith("model.path:")
    with pytest.raises(ConfigError) as vlm:
        check([*_good(assets, tmp_path / "out"), f"data.train_files={assets['vlm']}"])
    assert "data.train_files" in str(vlm.value) and "'images' column" in str(vlm.value)


_CLI = r"""
import contextlib, io, json, runpy, sys
results = []
for args in json.loads(sys.argv[1]):
    sys.argv = ["verl.trainer.sft_trainer", "--check-config", *args]
    out, err, code = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("verl.trainer.sft_trainer", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


def test_check_config_command_line(assets, tmp_path):
    """``python -m verl.trainer.sft_trainer --check-config``: ``config ok`` and 0, or the ``Config error:`` line and
    2 (both command lines in one interpreter, run as ``python -m`` runs the module)."""
    good = _good(assets, tmp_path / "out")
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([PY, "-c", _CLI, json.dumps([good, [*good, "optim.clip_grad=-1"]])], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok, bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ok["code"] == 0 and ok["stdout"].strip().splitlines()[-1] == "config ok", ok
    assert bad["code"] == 2 and "config ok" not in bad["stdout"], bad
    assert [ln for ln in bad["stderr"].splitlines() if ln.startswith("Config error:")][-1].startswith(
        "Config error: optim.clip_grad=-1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "--check-config wrote something"


# ------------------------------------------------------------------------------------------------ end to end
@pytest.mark.e2e
@pytest.mark.own_ray  # no Ray: the SFT trainer runs in this one process
def test_sft_trainer_lowers_the_loss_and_saves(assets, tmp_path):
    """Six steps of verl's layout on CPU (dynamic micro-batches, packed rows, LR warm-up then cosine): the training
    and validation losses fall, and step 6 is saved as a Hugging Face model dir plus resumable state."""
    ckpt = tmp_path / "ckpt"
    args = [*_good(assets, ckpt), "trainer.logger=[console,file]", "data.max_length=32", "optim.lr=3e-3",
            "optim.lr_warmup_steps=1", "optim.lr_scheduler_type=cosine", "optim.min_lr_ratio=0.5",
            "data.max_token_len_per_gpu=128", "trainer.total_training_steps=6", "trainer.test_freq=3",
            "trainer.device=cpu"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               VERL_FILE_LOGGER_PATH=str(tmp_path / "metrics.jsonl"))
    for name in ("RANK", "WORLD_SIZE", "RAY_ADDRESS"):
        env.pop(name, None)
    proc = subprocess.run([PY, "-m", "verl.trainer.sft_trainer", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "engine.use_torch_compile: True -> False" in proc.stdout  # verl's GPU default, changed on CPU
    rows = [json.loads(line)["data"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses, vals = [r["train/loss"] for r in rows], [r["val/loss"] for r in rows if "val/loss" in r]
    assert len(losses) == 6 and len(vals) == 2
    assert losses[-1] < losses[0] - 0.5, losses
    assert vals[-1] < vals[0], vals
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    step = ckpt / "global_step_6"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(step / "huggingface"))
    assert {"model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt"} <= set(os.listdir(step))
