"""Pairwise losses on the training engine: an optimizer step does not depend on how the pairs are cut into
micro-batches, and equals the step of the whole mini-batch's mean pair loss computed directly."""

import copy

import torch
from omegaconf import OmegaConf

from verl.trainer.preference import REF_KEY, BradleyTerryLoss, PairwisePreferenceLoss, pair_train_spec
from verl.trainer.preference.dataset import PreferenceDataset
from verl.utils.embedded import build_config, load_tokenizer
from verl.utils.embedded.preferences import make_preference_rows
from verl.workers.engine import FSDPEngine
from verl.workers.engine.hf_forward import forward_log_probs


def _pairs(tmp_path, n=4):
    import pandas as pd

    path = tmp_path / "p.parquet"
    pd.DataFrame(make_preference_rows(n, seed=3)).to_parquet(path)
    ds = PreferenceDataset(str(path), load_tokenizer(), OmegaConf.create({"max_prompt_length": 32,
                                                                          "max_response_length": 6}))
    pairs = ds.pairs(range(n))
    pairs.batch[REF_KEY] = -torch.rand(2 * n, generator=torch.Generator().manual_seed(0)) * 10
    return pairs


def _model(kind="causal"):
    from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    cfg = build_config("tiny")
    cfg.num_hidden_layers = 2
    if kind == "causal":
        return Qwen2ForCausalLM(cfg).float()
    cfg.num_labels = 1
    return Qwen2ForSequenceClassification(cfg).float()


def _step(model, pairs, loss, micro_pairs, outputs=("log_probs",)):
    model = copy.deepcopy(model)
    engine = FSDPEngine(model, torch.optim.SGD(model.parameters(), lr=1.0))
    engine.train_batch(pairs, loss, pair_train_spec(len(pairs) // 2, micro_pairs, outputs=outputs))
    return model


def test_dpo_step_is_independent_of_micro_batching_and_matches_the_direct_loss(tmp_path):
    pairs, model = _pairs(tmp_path), _model()
    loss = PairwisePreferenceLoss("sigmoid", beta=0.5, label_smoothing=0.1)
    one, four = _step(model, pairs, loss, 1), _step(model, pairs, loss, 4)
    direct = copy.deepcopy(model)
    _, lp = forward_log_probs(direct, pairs.batch, 1.0, False, False, True)
    value, _ = loss({"log_probs": lp}, pairs.batch)
    value.backward()
    with torch.no_grad():
        for p in direct.parameters():
            p -= p.grad
    for a, b, c in zip(one.parameters(), four.parameters(), direct.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_bradley_terry_step_is_independent_of_micro_batching(tmp_path):
    pairs, model = _pairs(tmp_path), _model("reward")
    model.config.pad_token_id = 0
    one = _step(model, pairs, BradleyTerryLoss(), 1, outputs=("scores",))
    two = _step(model, pairs, BradleyTerryLoss(), 2, outputs=("scores",))
    moved = any(not torch.equal(a, b) for a, b in zip(one.parameters(), model.parameters()))
    assert moved
    for a, b in zip(one.parameters(), two.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_kto_step_matches_the_direct_loss_with_a_constant_reference_point(tmp_path):
    """KTO rows [y_i, y'_i]: the engine step equals the step of mean_i kto_loss(y_i) with z computed from the
    mismatched rows y'_i as a constant, so the mismatched rows carry no gradient."""
    import pandas as pd

    from verl.trainer.preference import KTOLoss, kto_loss
    from verl.trainer.preference.dataset import UnpairedPreferenceDataset
    from verl.utils.embedded.preferences import make_kto_rows

    path = tmp_path / "kto.parquet"
    pd.DataFrame(make_kto_rows(make_preference_rows(3, seed=3))).to_parquet(path)
    ds = UnpairedPreferenceDataset(str(path), load_tokenizer(), OmegaConf.create({"max_prompt_length": 32,
                                                                                  "max_response_length": 6}))
    rows = ds.pairs(range(6))
    model, loss = _model(), KTOLoss(beta=0.5, desirable_weight=1.3, undesirable_weight=0.8)
    with torch.no_grad():  # reference log-probs a little below the policy's: log-ratios in (0, 2)
        _, lp0 = forward_log_probs(model, rows.batch, 1.0, False, False, True)
    shift = torch.rand(12, generator=torch.Generator().manual_seed(0)) * 2
    rows.batch[REF_KEY] = (lp0 * rows.batch["response_mask"]).sum(-1) - shift
    engine_step = _step(model, rows, loss, 6)
    direct = copy.deepcopy(model)
    _, lp = forward_log_probs(direct, rows.batch, 1.0, False, False, True)
    seq = (lp * rows.batch["response_mask"]).sum(-1)
    ref = rows.batch[REF_KEY]
    z = (seq[1::2].detach() - ref[1::2]).mean().clamp(min=0)
    assert z > 0  # the reference point is active in this test
    value, _ = kto_loss(seq[0::2], ref[0::2], rows.batch["label"][0::2].bool(), z, 0.5, 1.3, 0.8)
    value.mean().backward()
    with torch.no_grad():
        for p in direct.parameters():
            p -= p.grad
    moved = any(not torch.equal(a, b) for a, b in zip(engine_step.parameters(), model.parameters()))
    assert moved
    for a, c in zip(engine_step.parameters(), direct.parameters()):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)
