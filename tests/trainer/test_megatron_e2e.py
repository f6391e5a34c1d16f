"""End-to-end runs of verl's Megatron command line (``--config-name=ppo_megatron_trainer``) on CPU: two
processes, gloo, the tiny Qwen2 model, vLLM rollout, fp32. After every weight push the rollout engine must
agree with the Megatron trainer (``training/rollout_probs_diff_max`` <= 1e-3). Bad Megatron inputs fail
before any worker starts, naming the key."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_main_ppo_vllm import REPO, STEPS, assets, engine_layouts, grpo_args, run_main  # noqa: E402,F401

MEGATRON = ["--config-name=ppo_megatron_trainer"]


def _megatron_args(a, tp, pp, *extra, rollout_tp=1):
    return MEGATRON + grpo_args(a, f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
                                f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp}",
                                "actor_rollout_ref.rollout.load_format=dummy", *extra, rollout_tp=rollout_tp)


def _tiny_model(a):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(a["model"])


def _reward_model_dir(a, out):
    """The tiny model as a sequence classifier (num_labels=1) with a random score head, saved with its tokenizer."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(a["model"], num_labels=1)
    config.architectures = [config.architectures[0].replace("ForCausalLM", "ForSequenceClassification")]
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_config(config)
    rm.model.load_state_dict(AutoModelForCausalLM.from_pretrained(a["model"]).model.state_dict())
    torch.nn.init.normal_(rm.score.weight, std=1.0)
    rm.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (Path(a["model"]) / name).exists():
            shutil.copy(Path(a["model"]) / name, out / name)
    return out


def _in_sync(metrics, steps):
    assert sorted(metrics) == list(steps)
    for step, m in metrics.items():
        assert m["training/rollout_probs_diff_max"] <= 1e-3, (step, m["training/rollout_probs_diff_max"])
        assert m["response_length/mean"] > 0
    assert any(m.get("actor/grad_norm", 0) > 0 for m in metrics.values())


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_megatron_tp2_grpo_checkpoint_and_resume_on_tp1(assets, tmp_path):  # noqa: F811
    """TP=2 training -> two TP=1 vLLM engines: 3 steps in sync with vLLM and a checkpoint at step 3; then the same
    run resumes with TP=1 at step 4 (the dist-checkpoint reshards), still in sync after the push."""
    run = tmp_path / "run"
    metrics = run_main(run, _megatron_args(assets, 2, 1, "trainer.save_freq=3"))
    _in_sync(metrics, range(1, STEPS + 1))
    assert engine_layouts(run) == [f"rank {r}: vllm engine {r} of 2, tensor_parallel_size=1, tensor rank 0"
                                   for r in (0, 1)]
    # regroup by gather: each rank receives the other tensor rank's half of every sharded weight
    assert all(m["perf/weight_push_recv_bytes"] > 0.4 * m["perf/weight_push_bytes"] for m in metrics.values())
    ckpt = run / "checkpoints" / "verl_examples" / "gsm8k"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert (ckpt / "global_step_3" / "actor" / "dist_ckpt").is_dir()
    (run / "metrics.jsonl").unlink()
    resumed = run_main(run, _megatron_args(assets, 1, 1, f"trainer.total_training_steps={STEPS + 1}"))
    _in_sync(resumed, [STEPS + 1])


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_megatron_pp2_grpo_in_sync_every_step(assets, tmp_path):  # noqa: F811
    """Pipeline stages 2 -> one vLLM engine of tensor parallel 2 over the same two processes: each stage sends its
    layers to the other, each engine rank keeps its slice."""
    run = tmp_path / "pp2"
    _in_sync(run_main(run, _megatron_args(assets, 1, 2, rollout_tp=2)), range(1, STEPS + 1))
    assert engine_layouts(run)[0] == "rank 0: vllm engine 0 of 1, tensor_parallel_size=2, tensor rank 0"


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_megatron_ppo_with_megatron_critic(assets, tmp_path):  # noqa: F811
    """Megatron TP=2 -> vLLM TP=2 on the same ranks: each rank hands its engine rank its own shard. No rank
    gathers a tensor-parallel weight: what a rank receives is only the vocabulary rows that the engine's padding
    (multiple of 64) puts on the other rank than Megatron's (multiple of 128) -- 32 rows x 128 x 4 bytes here --
    and what it loads is about half the model. Synchronous rollout (one batch call per engine)."""
    args = _megatron_args(assets, 2, 1, "algorithm.adv_estimator=gae", f"critic.model.path={assets['model']}",
                          "critic.optim.lr=1e-3", "critic.ppo_micro_batch_size_per_gpu=8",
                          "critic.model.fsdp_config.dtype=fp32", "critic.model.fsdp_config.model_dtype=fp32",
                          "actor_rollout_ref.rollout.mode=sync",
                          "reward_model.enable=True", "reward_model.strategy=megatron",
                          f"reward_model.model.path={_reward_model_dir(assets, tmp_path / 'rm')}",
                          "reward_model.micro_batch_size_per_gpu=8",
                          "reward_model.megatron.tensor_model_parallel_size=2",
                          rollout_tp=2)
    run = tmp_path / "ppo"
    metrics = run_main(run, args)
    # the scores are the reward model's: the rule function gives digit fractions in [0, 1], the classifier's
    # random head gives scores of either sign
    assert any(m["critic/score/min"] < 0 for m in metrics.values()), metrics
    _in_sync(metrics, range(1, STEPS + 1))
    assert "[rollout] weight push: tp_pieces" in (run / "log.txt").read_text()
    full_model_bytes = 4 * sum(p.numel() for p in _tiny_model(assets).parameters())  # fp32, tied output layer
    for m in metrics.values():
        assert m["perf/weight_push_recv_bytes"] == 32 * 128 * 4, m
        assert 0.45 * full_model_bytes < m["perf/weight_push_bytes"] < 0.6 * full_model_bytes, (m, full_model_bytes)
    assert all(m["critic/vf_loss"] > 0 for m in metrics.values())
    assert any(m["critic/grad_norm"] > 0 for m in metrics.values())


def _fails_before_workers(tmp_path, args):
    run_dir = tmp_path / "bad"
    run_dir.mkdir()
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=run_dir, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert not any(run_dir.rglob("global_step_*"))
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("override,expected", [
    ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3", "tensor_model_parallel_size"),
    ("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3", "pipeline_model_parallel_size=3 must divide"),
])
def test_bad_megatron_sizes_fail_before_workers(assets, tmp_path, override, expected):  # noqa: F811
    args = MEGATRON + grpo_args(assets, override, workers=6)
    out = _fails_before_workers(tmp_path, args)
    assert expected in out, out[-3000:]


def test_bad_rollout_layout_fails_before_workers(assets, tmp_path):  # noqa: F811
    """Through the command line (the other layout errors are checked on the validator directly): the tiny model has
    2 key/value heads, so 4 engine ranks would split one."""
    out = _fails_before_workers(tmp_path, grpo_args(assets, workers=4, rollout_tp=4))
    assert "Config error: actor_rollout_ref.rollout.tensor_model_parallel_size=4 must divide the model's attention " \
           "heads (4) and key/value heads (2)" in out, out[-3000:]


def test_tp_not_dividing_heads(assets, tmp_path):  # noqa: F811
    # the tiny model has 4 heads and 2 key/value heads: TP=4 divides the heads, not the kv heads
    out = _fails_before_workers(tmp_path, MEGATRON + grpo_args(
        assets, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4", workers=4))
    assert "tensor_model_parallel_size=4 must divide" in out, out[-3000:]


def test_megatron_keys_with_fsdp_strategy(assets, tmp_path):  # noqa: F811
    out = _fails_before_workers(tmp_path, MEGATRON + grpo_args(
        assets, "actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.ref.strategy=fsdp",
        "critic.strategy=fsdp", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"))
    assert "applies to strategy=megatron only" in out, out[-3000:]


def test_unsupported_architecture(assets, tmp_path):  # noqa: F811
    import json
    import shutil

    model = tmp_path / "gpt2ish"
    shutil.copytree(assets["model"], model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]
    (model / "config.json").write_text(json.dumps(cfg))
    a = dict(assets, model=str(model))
    out = _fails_before_workers(tmp_path, MEGATRON + grpo_args(a))
    assert "does not support the architecture" in out, out[-3000:]
