"""SFT trainer (verl.trainer.fsdp_sft_trainer): config checks, the response-only loss, and end-to-end runs
(1 process, LoRA, and 2 processes under torchrun matching 1 process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")
PY = sys.executable


def _compose(overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="sft_trainer", overrides=list(overrides))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """Embedded arithmetic SFT parquet files and the tiny model directory."""
    import pandas as pd

    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import ArithmeticConfig, make_sft_rows

    root = tmp_path_factory.mktemp("sft_assets")
    cfg = ArithmeticConfig(min_digits=1, max_digits=1, operators="+-")
    pd.DataFrame(make_sft_rows(256, "train", seed=0, config=cfg)).to_parquet(root / "train.parquet")
    pd.DataFrame(make_sft_rows(24, "test", seed=1, config=cfg)).to_parquet(root / "test.parquet")
    model = make_model_dir(str(root / "model"), size="tiny")
    return {"root": root, "train": str(root / "train.parquet"), "test": str(root / "test.parquet"), "model": model}


def _overrides(assets, out, **extra):
    args = {
        "data.train_files": assets["train"],
        "data.val_files": assets["test"],
        "data.prompt_key": "prompt",
        "data.response_key": "response",
        "data.max_length": 32,
        "data.train_batch_size": 16,
        "data.micro_batch_size_per_gpu": 4,
        "model.partial_pretrain": assets["model"],
        "model.enable_gradient_checkpointing": "false",
        "optim.lr": "3e-3",
        "optim.lr_warmup_steps_ratio": 0.0,
        "optim.lr_scheduler": "constant",
        "trainer.total_training_steps": 6,
        "trainer.logger": "[console,file]",
        "trainer.default_local_dir": str(out / "ckpt"),
        "trainer.device": "cpu",
        "hydra.run.dir": str(out / "hydra"),
    }
    args.update(extra)
    return [f"{k}={v}" for k, v in args.items()]


def _run(cmd, out, threads="1", timeout=300):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=threads, VERL_FILE_LOGGER_PATH=str(out / "metrics.jsonl"))
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    with open(out / "metrics.jsonl") as f:
        return [json.loads(line) for line in f], proc


# ------------------------------------------------------------------------------------------------ config checks
def test_yaml_has_verl_keys_and_defaults():
    cfg = _compose()
    assert cfg.data.micro_batch_size_per_gpu == 4 and cfg.data.train_batch_size == 256
    assert cfg.data.multiturn.enable is False and cfg.data.multiturn.messages_key == "messages"
    assert cfg.model.lora_rank == 0 and cfg.model.lora_alpha == 16 and cfg.model.strategy == "fsdp2"
    assert list(cfg.optim.betas) == [0.9, 0.95] and cfg.optim.lr_scheduler == "cosine"
    assert cfg.trainer.default_local_dir == "checkpoints/gsm8k-sft/test"
    assert list(cfg.trainer.checkpoint.load_contents) == ["model", "optimizer", "extra"]
    assert cfg.trainer.device == "auto"


def test_config_errors_name_the_key(assets, tmp_path):
    from verl.trainer.sft.config import validate_sft_config
    from verl.utils.config import ConfigError

    base = [f"data.train_files={assets['train']}", f"data.val_files={assets['test']}"]
    plan = validate_sft_config(_compose(base + ["data.train_batch_size=16", "data.micro_batch_size_per_gpu=4"]), 2, "cpu")
    assert (plan.batch_size_per_rank, plan.grad_accum_steps) == (8, 2)
    with pytest.raises(ConfigError, match="data.micro_batch_size_per_gpu"):
        validate_sft_config(_compose(base + ["data.train_batch_size=16", "data.micro_batch_size_per_gpu=3"]), 1, "cpu")
    with pytest.raises(ConfigError, match="data.train_batch_size"):
        validate_sft_config(_compose(base + ["data.train_batch_size=15"]), 2, "cpu")
    with pytest.raises(ConfigError, match="data.val_files.*missing.parquet"):
        validate_sft_config(_compose([f"data.train_files={assets['train']}", f"data.val_files={tmp_path}/missing.parquet"]), 1, "cpu")
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size"):
        validate_sft_config(_compose(base + ["ulysses_sequence_parallel_size=2"]), 1, "cpu")


def test_cli_rejects_unknown_key_and_missing_model(assets, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    bad = subprocess.run([PY, "-m", "verl.trainer.fsdp_sft_trainer", "optim.learning_rate=1e-4"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "optim.learning_rate" in bad.stderr
    missing = subprocess.run(
        [PY, "-m", "verl.trainer.fsdp_sft_trainer", f"data.train_files={assets['train']}", "data.val_files=null",
         f"model.partial_pretrain={tmp_path}/nope", f"hydra.run.dir={tmp_path}/h"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "model.partial_pretrain" in missing.stderr, missing.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ the loss
def test_loss_counts_response_tokens_only(assets):
    """The SFT loss on the training engine's forward (padding trimmed) equals a hand computation over the
    response tokens of a right-padded batch."""
    from transformers import AutoModelForCausalLM

    from verl.trainer.fsdp_sft_trainer import sft_batch, sft_loss
    from verl.workers.engine import FSDPEngine, LossContext, MicroBatchSpec

    model = AutoModelForCausalLM.from_pretrained(assets["model"]).eval()
    engine = FSDPEngine(model, use_remove_padding=True)
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 10))
    attn = torch.ones_like(ids)
    attn[:, 8:] = 0  # trailing padding columns (trimmed by the engine)
    attn[1, 7:] = 0  # right padding
    loss_mask = torch.zeros_like(ids)
    loss_mask[0, 6:8] = 1
    loss_mask[1, 4:7] = 1
    batch = {"input_ids": ids, "attention_mask": attn, "position_ids": (attn.cumsum(-1) - 1).clamp(min=0), "loss_mask": loss_mask}
    data = sft_batch(batch)
    with torch.no_grad():
        outputs = engine.infer(data, ("log_probs",), MicroBatchSpec(2))
        loss, metrics = sft_loss(outputs, data.batch, LossContext(0, 0, 0, 1))
        logits = model(input_ids=ids, attention_mask=attn, position_ids=batch["position_ids"]).logits.float()
    logp = torch.log_softmax(logits, -1)
    # token t is predicted from position t - 1
    expected = -sum(logp[b, t - 1, ids[b, t]] for b in range(2) for t in range(1, 10) if loss_mask[b, t])
    assert int(data.batch["response_mask"].sum()) == 5
    torch.testing.assert_close(metrics["sft/loss_sum"], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, expected / 5, rtol=1e-5, atol=1e-5)
    # no response tokens: nothing is counted
    empty = sft_batch(dict(batch, loss_mask=torch.zeros_like(loss_mask)))
    loss0, metrics0 = sft_loss(outputs, empty.batch, LossContext(0, 0, 0, 1))
    assert float(loss0) == 0.0 and float(metrics0["sft/loss_sum"]) == 0.0


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def six_steps(assets, tmp_path_factory):
    """One plain 6-step run (constant lr), shared by the tests below."""
    out = tmp_path_factory.mktemp("six_steps")
    rows, _ = _run([PY, "-m", "verl.trainer.fsdp_sft_trainer", *_overrides(assets, out, **{"trainer.test_freq": 3})], out)
    return rows, out


@pytest.mark.e2e
def test_sft_lowers_loss_and_saves_loadable_hf_dir(assets, six_steps):
    rows, tmp_path = six_steps
    from transformers import AutoModelForCausalLM, AutoTokenizer

    losses = [r["data"]["train/loss"] for r in rows]
    vals = [r["data"]["val/loss"] for r in rows if "val/loss" in r["data"]]
    assert len(losses) == 6 and len(vals) == 2
    assert losses[-1] < losses[0] - 0.5, losses
    assert vals[-1] < vals[0], vals

    ckpt = tmp_path / "ckpt"
    hf_dir = ckpt / "global_step_6" / "huggingface"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(hf_dir))
    assert not [p for p in os.listdir(ckpt / "global_step_6") if ".tmp-" in p]
    tok = AutoTokenizer.from_pretrained(hf_dir)
    trained = AutoModelForCausalLM.from_pretrained(hf_dir)
    initial = AutoModelForCausalLM.from_pretrained(assets["model"])
    assert tok.decode(tok.encode("12+7=")) == "12+7="
    w_new, w_old = trained.model.embed_tokens.weight, initial.model.embed_tokens.weight
    assert not torch.equal(w_new, w_old)
    assert trained.lm_head.weight.data_ptr() == w_new.data_ptr()  # tied embeddings survive the export
    # the saved model reproduces the logged validation loss: the weights written are the weights trained
    from verl.utils.dataset.sft_dataset import SFTDataset

    ds = SFTDataset(assets["test"], tok, {"prompt_key": "prompt", "response_key": "response", "max_length": 32})
    batch = torch.utils.data.default_collate([ds[i] for i in range(len(ds))])
    with torch.no_grad():  # plain HF cross-entropy over the response tokens, no engine involved
        logits = trained.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                position_ids=batch["position_ids"]).logits[:, :-1].float()
    mask = batch["loss_mask"][:, 1:].float()
    token_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   batch["input_ids"][:, 1:].reshape(-1), reduction="none")
    assert abs(float((token_loss.view_as(mask) * mask).sum() / mask.sum()) - vals[-1]) < 1e-4


@pytest.mark.e2e
def test_lora_sft_saves_merged_model(assets, tmp_path):
    from transformers import AutoModelForCausalLM

    rows, _ = _run([PY, "-m", "verl.trainer.fsdp_sft_trainer",
                    *_overrides(assets, tmp_path, **{"model.lora_rank": 8, "model.lora_alpha": 16,
                                                     "trainer.total_training_steps": 3, "data.val_files": "null"})], tmp_path)
    assert len(rows) == 3 and all("val/loss" not in r["data"] for r in rows)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "global_step_3" / "huggingface")
    initial = AutoModelForCausalLM.from_pretrained(assets["model"])
    q_new, q_old = merged.model.layers[0].self_attn.q_proj.weight, initial.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(q_new, q_old)  # adapters were merged into the base weight
    torch.testing.assert_close(merged.model.embed_tokens.weight, initial.model.embed_tokens.weight)  # not a target


@pytest.mark.e2e
def test_two_processes_match_one_process(assets, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    extra = {"trainer.total_training_steps": 3, "trainer.test_freq": 3}
    rows1, _ = _run([PY, "-m", "verl.trainer.fsdp_sft_trainer", *_overrides(assets, one, **extra)], one)
    rows2, _ = _run([PY, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
                     "-m", "verl.trainer.fsdp_sft_trainer", *_overrides(assets, two, **extra)], two)
    l1 = [r["data"]["train/loss"] for r in rows1]
    l2 = [r["data"]["train/loss"] for r in rows2]
    assert len(l1) == len(l2) == 3
    for a, b in zip(l1, l2):
        assert abs(a - b) < 1e-5, (l1, l2)
    assert abs(rows1[-1]["data"]["val/loss"] - rows2[-1]["data"]["val/loss"]) < 1e-5


@pytest.mark.e2e
def test_resume_continues_exactly(assets, six_steps, tmp_path):
    """4 steps with a checkpoint every 2, then a second run to step 6 resumes from step 4 (model, optimizer,
    scheduler, data position) and logs the same losses as the uninterrupted 6-step run."""
    straight, _ = six_steps
    first, _ = _run([PY, "-m", "verl.trainer.fsdp_sft_trainer",
                     *_overrides(assets, tmp_path, **{"trainer.total_training_steps": 4, "trainer.save_freq": 2,
                                                      "data.val_files": "null"})], tmp_path)
    assert sorted(p for p in os.listdir(tmp_path / "ckpt") if p.startswith("global_step_")) == ["global_step_2", "global_step_4"]
    (tmp_path / "metrics.jsonl").unlink()
    second, proc = _run([PY, "-m", "verl.trainer.fsdp_sft_trainer",
                         *_overrides(assets, tmp_path, **{"data.val_files": "null"})], tmp_path)
    assert "resumed from" in proc.stdout
    assert [r["step"] for r in second] == [5, 6]
    expected = {r["step"]: r["data"]["train/loss"] for r in straight}
    for r in first + second:
        assert abs(r["data"]["train/loss"] - expected[r["step"]]) < 1e-5, (r, expected)
