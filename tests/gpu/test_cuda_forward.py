"""The actor's forward paths on a real GPU: preference pairs packed as one [prompt | chosen | rejected] row (a 4-D
block mask through CUDA sdpa) give the two-row layout's log-probs, and the LM head applied to response positions
only (``logits_to_keep``) gives the full forward's log-probs and gradients.

Skipped where there is no CUDA GPU (every CI machine of this project). Run on a GPU machine with
``python -m pytest -q tests/gpu``.
"""

import os
import sys

import pytest
import torch
from tensordict import TensorDict
from transformers import Qwen2ForCausalLM

from verl.utils.embedded import build_config
from verl.workers.engine.hf_forward import forward_log_probs
from verl.workers.engine.shared_prompt import forward_shared_prompt_log_probs, unsupported_reason

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers", "actor"))
from engine_testlib import FullLogitsForward  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPT_LEN, RESPONSE_LEN = 12, 6


def _model(dtype):
    torch.manual_seed(0)
    cfg = build_config("tiny")
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg).to(device="cuda", dtype=dtype)


def _pairs(n_pairs: int, seed: int = 0) -> TensorDict:
    """Interleaved rows [chosen_0, rejected_0, ...]: left-padded prompts of several lengths, right-padded answers."""
    g = torch.Generator().manual_seed(seed)
    ids, masks = [], []
    for _ in range(n_pairs):
        p = int(torch.randint(3, PROMPT_LEN + 1, (1,), generator=g))
        prompt = torch.randint(3, 259, (p,), generator=g).tolist()
        for _ in range(2):
            r = int(torch.randint(1, RESPONSE_LEN + 1, (1,), generator=g))
            resp = torch.randint(3, 259, (r,), generator=g).tolist()
            ids.append([0] * (PROMPT_LEN - p) + prompt + resp + [0] * (RESPONSE_LEN - r))
            masks.append([0] * (PROMPT_LEN - p) + [1] * (p + r) + [0] * (RESPONSE_LEN - r))
    ids, mask = torch.tensor(ids), torch.tensor(masks)
    return TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
                       "responses": ids[:, PROMPT_LEN:], "response_mask": mask[:, PROMPT_LEN:]},
                      batch_size=[len(ids)]).to("cuda")


def test_packed_pairs_match_two_rows_on_cuda():
    model = _model(torch.float32)
    assert unsupported_reason(model) is None
    batch = _pairs(8)
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        _, rows = forward_log_probs(model, batch, 1.0, False, True, True)
        _, packed = forward_shared_prompt_log_probs(model, batch)
    assert packed.device.type == "cuda" and packed.shape == rows.shape
    torch.testing.assert_close(packed[mask], rows[mask], rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_lm_head_on_response_positions_only_on_cuda(dtype):
    model = _model(dtype)
    batch = _pairs(6, seed=1)
    params = list(model.parameters())
    _, kept = forward_log_probs(model, batch, 0.9, use_remove_padding=True)
    grads_kept = torch.autograd.grad(kept.sum(), params)
    _, full = forward_log_probs(FullLogitsForward(model), batch, 0.9, use_remove_padding=True)
    grads_full = torch.autograd.grad(full.sum(), params)
    if dtype == torch.float32:
        torch.testing.assert_close(kept, full, rtol=0, atol=1e-5)
        for a, b in zip(grads_kept, grads_full):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    else:  # bf16: the LM head's matmul over fewer rows may take another kernel; same values to bf16 precision
        torch.testing.assert_close(kept, full, rtol=0, atol=5e-2)
