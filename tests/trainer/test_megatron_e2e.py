"""End-to-end runs of verl's Megatron command line (``--config-name=ppo_megatron_trainer``) on CPU: two
processes, gloo, the tiny Qwen2 model, vLLM rollout, fp32. After every weight push the rollout engine must
agree with the Megatron trainer (``training/rollout_probs_diff_max`` <= 1e-3). Bad Megatron inputs fail
before any worker starts, naming the key."""

import importlib.util
import subprocess
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_main_ppo_vllm import REPO, STEPS, assets, grpo_args, run_main  # noqa: E402,F401

MEGATRON = ["--config-name=ppo_megatron_trainer"]


def _megatron_args(a, tp, pp, *extra):
    return MEGATRON + grpo_args(a, f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
                                f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp}",
                                "actor_rollout_ref.rollout.load_format=dummy", *extra)


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_megatron_grpo_vllm_in_sync_every_step(assets, tmp_path, tp, pp):  # noqa: F811
    metrics = run_main(tmp_path / f"tp{tp}pp{pp}", _megatron_args(assets, tp, pp))
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step, m in metrics.items():
        assert m["training/rollout_probs_diff_max"] <= 1e-3, (step, m["training/rollout_probs_diff_max"])
        assert m["response_length/mean"] > 0
    assert any(m.get("actor/grad_norm", 0) > 0 for m in metrics.values())


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
