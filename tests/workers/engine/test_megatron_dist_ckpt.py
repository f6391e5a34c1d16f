"""Starting the Megatron engine from a Megatron distributed checkpoint (``megatron.use_dist_checkpointing``).

The converter (``python -m verl.models.mcore.converter_hf_to_mcore``, verl's arguments) writes a tiny Qwen2 as a
distributed checkpoint in one process (PP=1, TP=1, tied embeddings; ``--test`` reads it back). Engines then start
from it on a different layout over two gloo processes, TP=2 (dist-checkpointing reshards) and PP=2 (the last
stage's copy of the tied embedding is read from the embedding's tensor), and must hold exactly the weights and give
exactly the log-probs / entropies (functions of the full logits) of the same layout started from the HF weights.
A critic started from the checkpoint has a zero value head. Config checks refuse a missing path, naming the key.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "actor"))
from engine_testlib import make_batch, make_model_dir, run_distributed  # noqa: E402

from verl.workers.engine import MicroBatchSpec  # noqa: E402
from verl.workers.engine.config import EngineConfig  # noqa: E402

pytest.importorskip("megatron.core")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _engine(model_dir, tp, pp, dist_ckpt=None, kind="causal_lm"):
    from verl.workers.engine import get_engine_cls

    meg = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp}
    if dist_ckpt:
        meg.update(use_dist_checkpointing=True, dist_checkpointing_path=dist_ckpt)
    cfg = EngineConfig(model_path=model_dir, name="critic" if kind == "value" else "actor", strategy="megatron",
                       megatron=meg, model_kind=kind)
    return get_engine_cls("megatron").build(cfg)


def _rank(rank, world, model_dir, ckpt, out_dir, tp, pp):
    from verl.protocol import DataProto

    data = DataProto.from_dict(make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False))
    results = {}
    for start, path in (("hf", None), ("dist", ckpt)):
        engine = _engine(model_dir, tp, pp, path)
        out = engine.infer(data, ("log_probs", "entropy"), MicroBatchSpec(micro_batch_size=2))
        weights = {k: v.clone() for k, v in engine.iter_full_params()}
        results[start] = {"out": out, "weights": weights, "output_rank": engine.is_output_rank}
    critic = _engine(model_dir, tp, pp, ckpt, kind="value")
    values = critic.infer(data, ("values",), MicroBatchSpec(micro_batch_size=2))["values"]
    results["critic_head"] = {k: v.clone() for k, v in critic.iter_full_params() if k.startswith("score.")}
    results["values"] = values
    if results["hf"]["output_rank"]:
        torch.save(results, os.path.join(out_dir, "out.pt"))


DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist_ckpt")
    model_dir = make_model_dir(str(tmp / "model"), seed=0, tie=True)
    ckpt = str(tmp / "mcore")
    # one process of its own: a rank / world size another test left in this process's environment would make the
    # converter join a torchrun group that does not exist
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    proc = subprocess.run([sys.executable, "-m", "verl.models.mcore.converter_hf_to_mcore", "--hf_model_path",
                           model_dir, "--output_path", ckpt, "--test"], cwd=REPO, capture_output=True, text=True,
                          env=dict(env, PYTHONPATH=REPO, HF_HUB_OFFLINE="1", VERL_DEVICE="cpu"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "every weight equals the HF file" in proc.stdout
    assert os.path.isfile(os.path.join(ckpt, "metadata.json"))
    return model_dir, ckpt


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_start_from_dist_checkpoint_on_another_layout(converted, tmp_path, tp, pp):
    model_dir, ckpt = converted
    run_distributed(_rank, 2, model_dir, ckpt, str(tmp_path), tp, pp, err_dir=str(tmp_path))
    got = torch.load(tmp_path / "out.pt")
    hf, dist_start = got["hf"], got["dist"]
    assert hf["weights"].keys() == dist_start["weights"].keys()
    for name, tensor in hf["weights"].items():
        assert torch.equal(tensor, dist_start["weights"][name]), name
    mask = make_batch(bsz=4, prompt_len=6, resp_len=5, with_ref=False)["response_mask"].bool()
    for key in ("log_probs", "entropy"):
        assert torch.equal(hf["out"][key][mask], dist_start["out"][key][mask]), key
    assert set(got["critic_head"]) == {"score.weight", "score.bias"}
    assert all(not t.any() for t in got["critic_head"].values())  # a causal LM's checkpoint has no value head
    assert not got["values"].any()


def test_missing_dist_checkpoint_path_is_refused(tmp_path):
    from omegaconf import OmegaConf

    from verl.models.mcore.settings import check_megatron_settings
    from verl.trainer.config_schema.megatron import check_megatron_config
    from verl.utils.config import ConfigError
    from engine_testlib import tiny_config

    with pytest.raises(ValueError, match=r"actor\.megatron\.use_dist_checkpointing=True needs "
                                         r"actor\.megatron\.dist_checkpointing_path"):
        check_megatron_settings({"use_dist_checkpointing": True}, tiny_config(), "actor.megatron")
    ar = "actor_rollout_ref.actor.megatron"
    for path, match in ((None, rf"{ar}\.use_dist_checkpointing=True needs {ar}\.dist_checkpointing_path"),
                        ("", rf"{ar}\.use_dist_checkpointing=True needs {ar}\.dist_checkpointing_path"),
                        (str(tmp_path), rf"{ar}\.dist_checkpointing_path=.* is not a Megatron distributed checkpoint")):
        raw = OmegaConf.create({"actor_rollout_ref": {"actor": {"strategy": "megatron", "megatron": {
            "use_dist_checkpointing": True, "dist_checkpointing_path": path}}}, "trainer": {"n_gpus_per_node": 1}})
        with pytest.raises(ConfigError, match=match):
            check_megatron_config(raw, check_files=True)
