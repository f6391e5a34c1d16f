"""vLLM (the rollout engine) loads a make_model_dir directory and its tokenizer round-trips there too."""


import pytest

pytestmark = pytest.mark.vllm


def test_vllm_loads_embedded_model_dir(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    for key, value in dict(
        VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_NUM_OF_RESERVED_CPU="0"
    ).items():
        monkeypatch.setenv(key, value)
    from vllm import LLM, SamplingParams

    from verl.utils.embedded import EOS_TOKEN_ID, make_model_dir

    path = make_model_dir(str(tmp_path / "tiny"), size="tiny")
    llm = LLM(
        model=path,
        dtype="float32",
        enforce_eager=True,
        distributed_executor_backend="uni",
        max_model_len=128,
        max_num_seqs=4,
    )
    tok = llm.get_tokenizer()
    text = "a  b\n c 12+7=19"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "12+7="}], add_generation_prompt=True, tokenize=False)
    out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=1.0, seed=0, logprobs=0))[0].outputs[0]
    assert 1 <= len(out.token_ids) <= 8 and all(0 <= t < 259 for t in out.token_ids)
    assert len(out.logprobs) == len(out.token_ids)
    assert llm.llm_engine.get_tokenizer().eos_token_id == EOS_TOKEN_ID
