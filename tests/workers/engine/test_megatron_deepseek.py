"""DeepSeek-V3 (``DeepseekV3ForCausalLM``: multi-latent attention, DeepSeek's experts) on the Megatron engine (fp32,
gloo): a tiny random model, 3 layers (the first dense, ``first_k_dense_replace=1``), 8 routed experts in 2 groups
(``topk_group=1``: each token picks among one group's experts, chosen by ``sigmoid + e_score_correction_bias``), top-2
renormalised and scaled by ``routed_scaling_factor``, one shared expert; a random correction bias and perturbed norms
so that each of them matters.

- against Hugging Face: the engine's log-probs, entropies, gradient norm and weights after one PPO step equal the
  FSDP engine's on the HF model (the tolerances of ``test_megatron_moe``), and the weights exported under HF names
  before the step are the checkpoint's, bit for bit (the correction bias included); once with low-rank queries
  (``q_lora_rank``) and HF's interleaved rotary layout, once with ``q_lora_rank=None`` (one ``q_proj``),
  ``rope_interleave=False`` (rotary rows permuted on load and back on export) and yarn ``rope_scaling`` with
  ``mscale`` / ``mscale_all_dim``;
- expert parallel: EP=2 over two processes equals EP=1 on the same two processes;
- the config checks name what megatron-core cannot route as HF does.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_megatron_moe import EP_TOL, TOL, _assert_close, _fsdp_reference, _run  # noqa: E402

pytest.importorskip("megatron.core")

VOCAB = 259


def deepseek_config(variant: str = "lora"):
    from transformers import DeepseekV3Config

    extra = {}
    if variant == "plain_q_yarn":
        extra = dict(q_lora_rank=None, rope_interleave=False,
                     rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
                                      "mscale": 1.0, "mscale_all_dim": 1.0})
    return DeepseekV3Config(**{**dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        # DeepSeek's config.json names its router (vLLM reads these; HF's modelling always routes this way)
        topk_method="noaux_tc", scoring_func="sigmoid", architectures=["DeepseekV3ForCausalLM"]), **extra})


def make_deepseek_dir(path: str, variant: str = "lora", seed: int = 0) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(deepseek_config(variant)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
        for layer in model.model.layers[1:]:  # a bias that changes which experts are chosen
            layer.mlp.gate.e_score_correction_bias.copy_(0.1 * torch.randn_like(layer.mlp.gate.e_score_correction_bias))
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("variant", ["lora", "plain_q_yarn"])
def test_deepseek_matches_hf(tmp_path, variant):
    from safetensors.torch import load_file

    model_dir = make_deepseek_dir(str(tmp_path / "model"), variant)
    got = _run(tmp_path, "mcore", model_dir, 1, {"use_mbridge": True})
    ref = _fsdp_reference(model_dir)
    before = load_file(os.path.join(model_dir, "model.safetensors"))
    assert set(got["exported"]) == set(before)
    for name, tensor in before.items():
        assert torch.equal(got["exported"][name], tensor), name
    _assert_close(got, ref, TOL)
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(ref["metrics"]["actor/grad_norm"], rel=1e-5)
    for part in (".experts.", ".shared_experts.", "kv_b_proj", "layers.0.mlp."):
        moved = max((got["weights"][k] - before[k]).abs().max().item() for k in before if part in k)
        assert moved > 1e-4, part  # trained (a no-op update would also 'match')


def test_deepseek_expert_parallel_matches_ep1(tmp_path):
    model_dir = make_deepseek_dir(str(tmp_path / "model"))
    ep1 = _run(tmp_path, "ep1", model_dir, 2, {}, split=True)
    ep2 = _run(tmp_path, "ep2", model_dir, 2, {"expert_model_parallel_size": 2}, split=True)
    _assert_close(ep2, ep1, EP_TOL)
    assert ep2["grad_norms"] == pytest.approx(ep1["grad_norms"], rel=1e-6)


def test_deepseek_refusals():
    from verl.models.mcore.settings import check_megatron_settings

    check_megatron_settings({"expert_model_parallel_size": 8}, deepseek_config(), "actor.megatron")
    cases = [
        (dict(norm_topk_prob=False), r"norm_topk_prob=False .* supports norm_topk_prob=True"),
        (dict(num_experts_per_tok=4), r"num_experts_per_tok=4 with topk_group=1: .* best 2 experts"),
        (dict(scoring_func="softmax"), r"config.scoring_func='softmax': DeepseekV3ForCausalLM routes with "
                                       r"scoring_func='sigmoid'"),
        (dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
         r"rope_scaling type 'linear' is not supported"),
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                               "original_max_position_embeddings": 64, "mscale": 0.7, "mscale_all_dim": 0}),
         r"mscale=0.7 / mscale_all_dim=0 .* set mscale and mscale_all_dim"),
    ]
    for change, message in cases:
        config = deepseek_config()
        for k, v in change.items():
            setattr(config, k, v)
        with pytest.raises(ValueError, match=message):
            check_megatron_settings({}, config, "actor.megatron")
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=3 must divide"):
        check_megatron_settings({"tensor_model_parallel_size": 3, "sequence_parallel": True}, deepseek_config(),
                                "actor.megatron")


def test_deepseek_tensor_and_expert_parallel_match_one_process(tmp_path):
    # TP=2 with sequence parallel (the multi-latent attention's heads cut in two, its down projections replicated)
    # and the experts split over the two ranks
    model_dir = make_deepseek_dir(str(tmp_path / "model"))
    one = _run(tmp_path, "one", model_dir, 1, {})
    both = _run(tmp_path, "tp2ep2", model_dir, 2, {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2,
                                                    "expert_tensor_parallel_size": 1, "sequence_parallel": True})
    _assert_close(both, one, TOL)
    assert both["metrics"]["actor/grad_norm"] == pytest.approx(one["metrics"]["actor/grad_norm"], rel=1e-5)
