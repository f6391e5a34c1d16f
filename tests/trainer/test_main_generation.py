"""main_generation on the tiny embedded model: responses parquet (n_samples per prompt), greedy output equal to
transformers' generate, then main_eval on it; bad input fails before anything is written."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.trainer.main_eval import run_eval
from verl.trainer.main_generation import run_generation
from verl.utils.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")
QUESTIONS = ["1+2=", "3*3=", "7-5=", "2+2=", "9-1="]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from verl.utils.embedded import make_model_dir

    root = tmp_path_factory.mktemp("gen")
    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": q}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(eval(q[:-1]))}, "extra_info": {"index": i}}
            for i, q in enumerate(QUESTIONS)]
    pq.write_table(pa.Table.from_pylist(rows), str(root / "prompts.parquet"))
    return {"root": root, "model": make_model_dir(str(root / "model"), size="tiny", seed=0),
            "data": root / "prompts.parquet"}


def gen_cfg(a, out, *overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="generation", overrides=[
            f"data.path={a['data']}", f"data.output_path={out}", f"model.path={a['model']}", "rollout.name=hf",
            "rollout.dtype=float32", "rollout.prompt_length=32", "rollout.response_length=6", "data.batch_size=2",
            *overrides])


def test_sampling_then_eval(assets, tmp_path):
    out = tmp_path / "o" / "gen.parquet"
    run_generation(gen_cfg(assets, out, "data.n_samples=3", "rollout.temperature=1.0", "rollout.top_p=1.0"))
    rows = pq.read_table(out).to_pylist()
    assert [r["prompt"][0]["content"] for r in rows] == QUESTIONS
    assert all(len(r["responses"]) == 3 and all(isinstance(t, str) for t in r["responses"]) for r in rows)
    assert rows[2]["reward_model"]["ground_truth"] == "2" and rows[2]["extra_info"]["index"] == 2
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        m = run_eval(compose(config_name="evaluation", overrides=[f"data.path={out}"]))
    assert m["num_prompts/arithmetic"] == 5 and 0.0 <= m["test_score/arithmetic"] <= 1.0
    assert set(m) >= {"pass@1/arithmetic", "pass@2/arithmetic", "pass@3/arithmetic"}
    assert m["pass@1/arithmetic"] <= m["pass@2/arithmetic"] <= m["pass@3/arithmetic"]


def test_greedy_matches_transformers_generate(assets, tmp_path):
    out = tmp_path / "greedy.parquet"
    run_generation(gen_cfg(assets, out, "data.n_samples=1", "rollout.temperature=0"))
    got = [r["responses"][0] for r in pq.read_table(out).to_pylist()]
    tok = AutoTokenizer.from_pretrained(assets["model"])
    model = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch.float32)
    want = []
    for q in QUESTIONS:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        seq = model.generate(**ids, max_new_tokens=6, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        want.append(tok.decode(seq[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    assert got == want


def test_overlong_prompts(assets, tmp_path, capsys):
    long_rows = pq.read_table(assets["data"]).to_pylist()
    long_rows[3]["prompt"] = [{"role": "user", "content": "1+" * 40 + "1="}]
    data = tmp_path / "long.parquet"
    pq.write_table(pa.Table.from_pylist(long_rows), str(data))
    out = tmp_path / "gen.parquet"
    with pytest.raises(ConfigError, match=r"row 3 of .*long.parquet is \d+ tokens, longer than "
                                          r"data.max_prompt_length=32"):
        run_generation(gen_cfg(assets, out, f"data.path={data}", "data.n_samples=1", "rollout.temperature=0"))
    assert not out.exists()
    run_generation(gen_cfg(assets, out, f"data.path={data}", "data.n_samples=1", "rollout.temperature=0",
                           "data.filter_overlong_prompts=True"))
    assert "filtered 1 of 5 prompts longer than data.max_prompt_length=32" in capsys.readouterr().out
    assert [r["extra_info"]["index"] for r in pq.read_table(out).to_pylist()] == [0, 1, 2, 4]


@pytest.mark.parametrize("override, message", [
    ("data.n_samples=0", "data.n_samples must be a positive integer"),
    ("data.n_samples=-2", "data.n_samples must be a positive integer"),
    ("rollout.temperature=0", "set data.n_samples=1"),
    ("rollout.n=4", "rollout.n=4 has no effect in main_generation .*data.n_samples"),
    ("rollout.name=sglang", "rollout.name='sglang' is not available"),
    ("actor.ulysses_sequence_parallel_size=2", "no actor"),
    ("rollout.tensor_model_parallel_size=2", "needs rollout.name=vllm .*hf engine has no tensor parallelism"),
    ("rollout.tensor_model_parallel_size=0", "tensor_model_parallel_size must be a positive integer"),
])
def test_config_errors_write_nothing(assets, tmp_path, override, message):
    out = tmp_path / "gen.parquet"
    with pytest.raises(ConfigError, match=message):
        run_generation(gen_cfg(assets, out, "data.n_samples=2", override))
    assert not out.exists() and not list(tmp_path.iterdir())


def test_model_without_chat_template(assets, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(assets["model"], bare)
    for name in ("chat_template.jinja",):
        (bare / name).unlink(missing_ok=True)
    tok = AutoTokenizer.from_pretrained(bare)
    if tok.chat_template:  # the template may also live in tokenizer_config.json
        import json
        cfg = json.loads((bare / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    out = tmp_path / "gen.parquet"
    with pytest.raises(ConfigError, match="has no chat template"):
        run_generation(gen_cfg(assets, out, f"model.path={bare}", "data.n_samples=1", "rollout.temperature=0"))
    assert not out.exists()


def test_cli_exit_code(assets, tmp_path):
    out = tmp_path / "gen.parquet"
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_generation", f"data.path={assets['data']}",
                           f"data.output_path={out}", f"model.path={assets['model']}", "data.n_samples=0"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "data.n_samples" in proc.stderr
    assert not out.exists()


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_vllm_greedy_matches_hf(assets, tmp_path):
    """The vLLM engine, tensor-parallel over 2 processes (verl's rollout.tensor_model_parallel_size; each holds
    half of every layer), writes the same greedy responses as the HF engine."""
    hf, vl = tmp_path / "hf.parquet", tmp_path / "vllm_tp2.parquet"
    common = ("data.n_samples=1", "rollout.temperature=0", "rollout.max_num_seqs=8")
    run_generation(gen_cfg(assets, hf, *common))
    # the vLLM engine runs in its own processes, as users run it: an in-process vLLM engine would stay in this
    # pytest process, and tests that fork later (run_distributed) must not inherit its threads
    args = [f"data.path={assets['data']}", f"data.output_path={vl}", f"model.path={assets['model']}",
            "rollout.name=vllm", "rollout.dtype=float32", "rollout.prompt_length=32", "rollout.response_length=6",
            "data.batch_size=2", "rollout.tensor_model_parallel_size=2", *common, f"hydra.run.dir={tmp_path / 'hydra'}"]
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_generation", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    hf_rows, vl_rows = pq.read_table(hf).to_pylist(), pq.read_table(vl).to_pylist()
    assert [r["responses"] for r in vl_rows] == [r["responses"] for r in hf_rows]
    assert proc.stdout.count("engine ready") == 1  # one engine (its first rank reports)
