"""The embedded tokenizer and model directory, loaded the way users load them (AutoTokenizer / AutoModel)."""

import json
import os
import stat

import pytest
import torch

from verl.utils.embedded import tokenizer as emb_tok
from verl.utils.embedded.model import MODEL_SIZES, build_model, count_parameters, make_model_dir

TEXTS = [
    "12+7=19",
    "  two  spaces,\nnewline\n\nand\ttab ",
    'Let\'s think step by step and output the final answer after "####".',
    "(3*4)-5/1 = 7; Ünïcödé and 中文 survive too",
    "",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(str(tmp_path_factory.mktemp("m") / "tiny"), size="tiny", seed=0)


def _roundtrip(tok):
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert len(ids) == len(text.encode("utf-8"))  # one token per byte: nothing merged, nothing dropped


def test_roundtrip_through_autotokenizer_beside_qwen2_config(model_dir):
    from transformers import AutoTokenizer

    with open(os.path.join(model_dir, "config.json")) as f:
        assert json.load(f)["model_type"] == "qwen2"
    tok = AutoTokenizer.from_pretrained(model_dir)
    _roundtrip(tok)
    assert tok.encode(" \n", add_special_tokens=False) == [32, 10]
    assert len(tok) == emb_tok.VOCAB_SIZE
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == emb_tok.EOS_TOKEN_ID
    assert tok.pad_token_id == emb_tok.PAD_TOKEN_ID
    # no special token is added on its own (like Qwen2)
    assert tok("12+7=")["input_ids"] == [ord(c) for c in "12+7="]


def test_load_tokenizer_and_chat_template():
    tok = emb_tok.load_tokenizer()
    _roundtrip(tok)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "12 + 7 =\n?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert (
        text
        == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n12 + 7 =\n?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(text, add_special_tokens=False)
    assert ids.count(emb_tok.BOS_TOKEN_ID) == 3 and ids.count(emb_tok.EOS_TOKEN_ID) == 2
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "system\nbe brief\nuser\n12 + 7 =\n?\nassistant\n"
    no_gen = tok.apply_chat_template(msgs[1:], add_generation_prompt=False, tokenize=False)
    assert no_gen == "<|im_start|>user\n12 + 7 =\n?<|im_end|>\n"


def test_committed_assets_match_builder(tmp_path):
    emb_tok.save_tokenizer(str(tmp_path))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        with open(tmp_path / name) as f_new, open(os.path.join(emb_tok.ASSETS_DIR, name)) as f_old:
            new, old = f_new.read(), f_old.read()
        if name.endswith(".json"):
            new, old = json.loads(new), json.loads(old)
        assert new == old, f"{name} drifted from build_tokenizer(); run python -m verl.utils.embedded.tokenizer"


def test_model_sizes_and_determinism():
    expected = {"tiny": (0.8e6, 1.3e6), "small": (20e6, 30e6), "base": (85e6, 115e6)}
    assert set(MODEL_SIZES) == set(expected)
    # the tiny one is checked by building it; the larger ones by the arithmetic of their shapes
    tiny_a, tiny_b, tiny_c = build_model("tiny", 0), build_model("tiny", 0), build_model("tiny", 1)
    lo, hi = expected["tiny"]
    assert lo <= count_parameters(tiny_a) <= hi
    assert tiny_a.config.tie_word_embeddings and tiny_a.lm_head.weight is tiny_a.model.embed_tokens.weight
    sa, sb, sc = tiny_a.state_dict(), tiny_b.state_dict(), tiny_c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])
    for size in ("small", "base"):
        s = MODEL_SIZES[size]
        h, f, n, kv = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["num_key_value_heads"]
        head = h // s["num_attention_heads"]
        attn = 2 * h * h + 2 * h * kv * head + h + 2 * kv * head  # q,o + k,v weights + q,k,v biases
        total = emb_tok.VOCAB_SIZE * h + n * (attn + 3 * h * f + 2 * h) + h
        lo, hi = expected[size]
        assert lo <= total <= hi, (size, total)
    with pytest.raises(ValueError, match="tiny"):
        build_model("huge")


def test_model_dir_loads_and_generation_stops_at_eos(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = set(os.listdir(model_dir))
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    assert not any(n.startswith(".") for n in os.listdir(os.path.dirname(model_dir)))  # no temp dirs left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(model_dir).st_mode) == 0o777 & ~umask  # not mkdtemp's 0700
    assert stat.S_IMODE(os.stat(os.path.join(model_dir, "model.safetensors")).st_mode) == 0o666 & ~umask
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id

    prompt = tok.apply_chat_template([{"role": "user", "content": "12+7="}], add_generation_prompt=True, tokenize=False)
    p_ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
    with torch.no_grad():
        logits = model(input_ids=p_ids).logits
    assert logits.shape == (1, p_ids.shape[1], len(tok)) and torch.isfinite(logits).all()

    # Make the next token a chosen one whatever the context: layers write nothing into the residual stream,
    # every embedding has +1 in dimension 0, the final norm keeps only that dimension, and the chosen
    # token's embedding is largest there. Greedy decoding then emits it every step.
    def force(token_id):
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            emb = model.model.embed_tokens.weight
            emb[:, 0] = 1.0
            emb[token_id, 0] = 5.0
            model.model.norm.weight.zero_()
            model.model.norm.weight[0] = 1.0

    force(tok.eos_token_id)
    out = model.generate(p_ids, max_new_tokens=20, do_sample=False)
    assert out[0, p_ids.shape[1] :].tolist() == [tok.eos_token_id]  # stopped at eos from generation_config
    seven = tok.convert_tokens_to_ids("7")
    force(seven)
    model.model.embed_tokens.weight.data[tok.eos_token_id, 0] = 1.0
    out = model.generate(p_ids, max_new_tokens=5, do_sample=False)
    assert tok.decode(out[0, p_ids.shape[1] :]) == "77777"  # no eos: runs to max_new_tokens


def test_make_model_dir_reuse_and_conflict(model_dir):
    before = os.path.getmtime(os.path.join(model_dir, "model.safetensors"))
    assert make_model_dir(model_dir, size="tiny", seed=0) == model_dir  # same model: reused, not rewritten
    assert os.path.getmtime(os.path.join(model_dir, "model.safetensors")) == before
    with pytest.raises(FileExistsError, match="overwrite"):
        make_model_dir(model_dir, size="tiny", seed=1)


def test_make_model_cli(tmp_path, capsys):
    from verl.utils.embedded import make_model

    out = tmp_path / "cli_model"
    assert make_model.main(["--size", "tiny", "--out", str(out), "--seed", "3"]) == str(out)
    assert capsys.readouterr().out.strip() == str(out)
    with open(out / "embedded_model.json") as f:
        assert json.load(f) == {"size": "tiny", "seed": 3}
    with pytest.raises(SystemExit) as exc:
        make_model.main(["--size", "tiny", "--out", str(out), "--seed", "4"])
    assert exc.value.code == 2 and "--overwrite" in capsys.readouterr().err
    make_model.main(["--size", "tiny", "--out", str(out), "--seed", "4", "--overwrite"])
    with open(out / "embedded_model.json") as f:
        assert json.load(f) == {"size": "tiny", "seed": 4}
