import string

import numpy as np
import pytest
import torch

PAD, EOS = "<pad>", "<eos>"


@pytest.fixture(scope="session")
def char_tokenizer():
    """A real ``PreTrainedTokenizerFast``: one token per character, <pad>=0, <eos>=1."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = string.ascii_letters + string.digits + string.punctuation + " \n"
    vocab = {PAD: 0, EOS: 1, "<unk>": 2}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token="<unk>")
    assert fast.decode(fast.encode("ab 1")) == "ab 1"
    return fast


@pytest.fixture
def make_batch(char_tokenizer):
    return lambda rows, **kw: build_batch(char_tokenizer, rows, **kw)


@pytest.fixture
def response_lengths(char_tokenizer):
    return lambda rows, resp_len=24: [min(len(char_tokenizer.encode(r)) + 1, resp_len) for _, r, _, _ in rows]


def build_batch(tokenizer, rows, prompt_len=16, resp_len=24):
    """A rollout-shaped DataProto: left-padded ``prompts``, right-padded ``responses`` ending with EOS, and
    the attention mask over both. ``rows`` = [(prompt, response, data_source, ground_truth), ...]."""
    from verl.protocol import DataProto

    b = len(rows)
    prompts = torch.full((b, prompt_len), tokenizer.pad_token_id, dtype=torch.long)
    responses = torch.full((b, resp_len), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((b, prompt_len + resp_len), dtype=torch.long)
    for i, (prompt, response, _, _) in enumerate(rows):
        p = tokenizer.encode(prompt)[-prompt_len:]
        r = (tokenizer.encode(response) + [tokenizer.eos_token_id])[:resp_len]
        prompts[i, prompt_len - len(p):] = torch.tensor(p)
        responses[i, : len(r)] = torch.tensor(r)
        mask[i, prompt_len - len(p): prompt_len + len(r)] = 1
    non_tensor = {
        "data_source": np.array([row[2] for row in rows], dtype=object),
        "reward_model": np.array([{"ground_truth": row[3], "style": "rule"} for row in rows], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(b)], dtype=object),
    }
    tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
               "attention_mask": mask}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensor)
