"""Tool / user tokens inside a multi-turn response (response_mask 0, attention 1) get no gradient: whatever
advantages or old log-probs sit on them, the actor update is bit-identical; on model tokens it is not."""

import copy
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "workers", "actor"))
from engine_testlib import actor_config, make_batch, tiny_model  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.utils.fsdp_utils import build_optimizer  # noqa: E402
from verl.workers.actor.dp_actor import DataParallelPPOActor, typed_actor_config  # noqa: E402


def multi_turn_batch():
    b = make_batch(4, 6, 12, seed=3)
    b["attention_mask"][:, 6:] = 1  # every response position is a real token
    b["position_ids"] = torch.clip(torch.cumsum(b["attention_mask"], -1) - 1, min=0)
    b["input_ids"][:, 6:] = torch.randint(3, 259, (4, 12), generator=torch.Generator().manual_seed(1))
    b["responses"] = b["input_ids"][:, 6:].clone()
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[:, 3:7] = 0  # a tool turn in the middle of every response
    b["response_mask"] = mask
    return b


def update(batch, key_changes):
    batch = copy.deepcopy(batch)
    for key, (cols, value) in key_changes.items():
        batch[key][:, cols] = value
    model = tiny_model(seed=5)
    cfg = actor_config()
    actor = DataParallelPPOActor(cfg, model, build_optimizer(model.parameters(), typed_actor_config(cfg).optim))
    metrics = actor.update_policy(DataProto.from_dict(batch, meta_info={"temperature": 1.0}))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def test_tool_tokens_get_no_gradient():
    b = multi_turn_batch()
    base, m0 = update(b, {})
    tool_cols = slice(3, 7)
    same, m1 = update(b, {"advantages": (tool_cols, 50.0), "old_log_probs": (tool_cols, -0.01)})
    assert all(torch.equal(base[k], same[k]) for k in base)
    assert m0["actor/grad_norm"] == m1["actor/grad_norm"]
    # the control: the same change on model tokens moves the weights
    moved, _ = update(b, {"advantages": (slice(0, 3), 50.0), "old_log_probs": (slice(0, 3), -0.01)})
    assert any(not torch.equal(base[k], moved[k]) for k in base)
