"""Host-aware defaults: on a CPU without native bf16 the compute dtypes the user did not set become fp32 and
gradient checkpointing goes off when memory is plentiful; explicit values are never overridden; on GPU verl's
defaults stay."""

import os

import pytest
from hydra import compose, initialize_config_dir

from verl.trainer import host_defaults
from verl.trainer.host_defaults import COMPUTE_DTYPE_KEYS, resolve_host_defaults

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "verl", "trainer", "config")


def _compose(overrides=()):
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


@pytest.fixture(autouse=True)
def _no_niceness_env(monkeypatch):
    """resolve_host_defaults sets Ray variables for the Ray it is about to start: keep that in the test."""
    for name in host_defaults.RAY_ENV:
        monkeypatch.setenv(name, "15")
        monkeypatch.delenv(name)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.fixture(scope="module")
def defaults():
    return _compose()


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)  # a 4 KiB "model": fits many times over
    return str(tmp_path)


def _select(cfg, key):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key)


def test_avx2_host_gets_fp32_and_no_checkpointing(monkeypatch, defaults, model_dir):
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: False)
    cfg = _compose(["trainer.device=cpu", f"actor_rollout_ref.model.path={model_dir}", f"critic.model.path={model_dir}"])
    choices = resolve_host_defaults(cfg, set(), defaults)
    for key in COMPUTE_DTYPE_KEYS:
        assert _select(cfg, key) == "fp32", key
    assert _select(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing") is False
    assert _select(cfg, "critic.model.enable_gradient_checkpointing") is False
    text = str(choices)
    assert "native bf16=no" in text and "bfloat16 -> fp32" in text and "enable_gradient_checkpointing: True -> False" in text
    compiled = [c for c in choices.changed if c[0].endswith("use_torch_compile")]
    assert len(choices.changed) - len(compiled) == len(COMPUTE_DTYPE_KEYS) + 2 + len(host_defaults.RAY_ENV)


def test_torch_compile_default_is_eager_on_cpu_and_kept_when_set(monkeypatch, defaults):
    cfg = _compose(["trainer.device=cpu"])
    choices = resolve_host_defaults(cfg, set(), defaults)
    for key in host_defaults.COMPILE_KEYS:  # the reference's key follows the actor's
        assert _select(cfg, key) is False, key
    assert "use_torch_compile: True -> False" in str(choices)
    # set on the command line (even at verl's default): compiled as asked
    cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.actor.use_torch_compile=true"])
    resolve_host_defaults(cfg, {"actor_rollout_ref.actor.use_torch_compile"}, defaults)
    assert _select(cfg, "actor_rollout_ref.actor.use_torch_compile") is True
    assert _select(cfg, "actor_rollout_ref.ref.use_torch_compile") is True
    assert _select(cfg, "critic.model.fsdp_config.use_torch_compile") is False  # not set: resolved


def test_explicit_values_are_never_overridden(monkeypatch, defaults, model_dir):
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: False)
    # named on the command line, even at verl's default value
    cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.actor.fsdp_config.dtype=bfloat16",
                    f"actor_rollout_ref.model.path={model_dir}",
                    "actor_rollout_ref.model.enable_gradient_checkpointing=true"])
    choices = resolve_host_defaults(cfg, {"actor_rollout_ref.actor.fsdp_config.dtype",
                                          "actor_rollout_ref.model.enable_gradient_checkpointing"}, defaults)
    assert _select(cfg, "actor_rollout_ref.actor.fsdp_config.dtype") == "bfloat16"
    assert _select(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing") is True
    assert ("actor_rollout_ref.actor.fsdp_config.dtype", "bfloat16") in [(k, v) for k, v, _ in choices.kept]
    # a value different from the shipped default counts as set, without an override list
    cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.rollout.dtype=float16"])
    resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, "actor_rollout_ref.rollout.dtype") == "float16"
    assert _select(cfg, "actor_rollout_ref.actor.fsdp_config.dtype") == "fp32"  # not set: resolved


def test_native_bf16_host_keeps_bf16(monkeypatch, defaults):
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: True)
    cfg = _compose(["trainer.device=cpu"])
    resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, "actor_rollout_ref.actor.fsdp_config.dtype") == "bfloat16"


def test_gpu_keeps_verls_defaults(monkeypatch, defaults, model_dir):
    monkeypatch.setattr(host_defaults, "resolve_device", lambda value: "cuda")
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: False)
    cfg = _compose([f"actor_rollout_ref.model.path={model_dir}"])
    choices = resolve_host_defaults(cfg, set(), defaults)
    assert choices.changed == [] and "nothing changed" in str(choices)
    assert _select(cfg, "actor_rollout_ref.actor.fsdp_config.dtype") == "bfloat16"
    assert _select(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing") is True


def test_big_model_keeps_checkpointing(monkeypatch, defaults, tmp_path):
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(host_defaults, "_weights_bytes", lambda path: 64 * 1024**3)  # 64 GiB of weights
    cfg = _compose(["trainer.device=cpu", f"actor_rollout_ref.model.path={tmp_path}"])
    resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing") is True


ON_POLICY = ["trainer.device=cpu", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
OLD = "actor_rollout_ref.actor.old_log_prob_source"


def test_one_update_per_batch_takes_old_log_probs_from_the_update(monkeypatch, defaults):
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: True)
    cfg = _compose(ON_POLICY)
    choices = resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, OLD) == "update"
    assert f"{OLD}: trainer -> update" in str(choices)
    # verl's default batch sizes (1024 prompts, mini-batches of 256): four updates per batch, the pass stays
    cfg = _compose(["trainer.device=cpu"])
    choices = resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, OLD) == "trainer"
    assert any(k == OLD and "ppo_mini_batch_size=256 < data.train_batch_size=1024" in why for k, _, why in choices.kept)


@pytest.mark.parametrize("extra, why", [
    (["actor_rollout_ref.actor.ppo_epochs=2"], "ppo_epochs=2"),
    (["algorithm.use_kl_in_reward=true"], "use_kl_in_reward"),
    (["algorithm.rollout_correction.rollout_is=token"], "rollout_correction.rollout_is"),
    (["algorithm.rollout_correction.bypass_mode=true"], "bypass_mode"),
    (["actor_rollout_ref.actor.strategy=megatron"], "strategy=megatron"),
])
def test_old_log_prob_pass_stays_where_the_update_is_not_exact(monkeypatch, defaults, extra, why):
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: True)
    cfg = _compose(ON_POLICY + extra)
    choices = resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, OLD) == "trainer"
    assert any(k == OLD and why in reason for k, _, reason in choices.kept), choices.kept


def test_old_log_prob_source_set_by_the_user_or_on_gpu_stays(monkeypatch, defaults):
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: True)
    cfg = _compose(ON_POLICY + [f"{OLD}=trainer"])
    resolve_host_defaults(cfg, {OLD}, defaults)
    assert _select(cfg, OLD) == "trainer"
    monkeypatch.setattr(host_defaults, "resolve_device", lambda value: "cuda")
    cfg = _compose(ON_POLICY[1:])
    resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, OLD) == "trainer"  # verl's separate pass on GPU


def test_ray_workers_run_at_normal_priority_on_cpu(monkeypatch, defaults):
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: True)
    choices = resolve_host_defaults(_compose(["trainer.device=cpu"]), set(), defaults)
    assert os.environ[host_defaults.NICENESS_ENV] == "0"
    assert "RAY_worker_niceness (environment): 15 -> 0" in str(choices)
    assert os.environ[host_defaults.INLINE_ARGS_ENV] == str(1 << 20)
    assert "RAY_max_direct_call_object_size (environment): 102400 -> 1048576" in str(choices)
    monkeypatch.setenv(host_defaults.NICENESS_ENV, "10")  # the user's value stays
    choices = resolve_host_defaults(_compose(["trainer.device=cpu"]), set(), defaults)
    assert os.environ[host_defaults.NICENESS_ENV] == "10" and "RAY_worker_niceness (environment)=10 kept" in str(choices)
    monkeypatch.delenv(host_defaults.NICENESS_ENV)
    monkeypatch.delenv(host_defaults.INLINE_ARGS_ENV)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # joining a cluster: its settings stay
    resolve_host_defaults(_compose(["trainer.device=cpu"]), set(), defaults)
    assert host_defaults.NICENESS_ENV not in os.environ and host_defaults.INLINE_ARGS_ENV not in os.environ


RESHARD = ("actor_rollout_ref.actor.fsdp_config.reshard_after_forward",
           "actor_rollout_ref.ref.fsdp_config.reshard_after_forward", "critic.model.fsdp_config.reshard_after_forward")


def test_one_process_keeps_gathered_parameters(monkeypatch, defaults):
    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: True)
    cfg = _compose(["trainer.device=cpu", "trainer.n_gpus_per_node=1"])
    choices = resolve_host_defaults(cfg, set(), defaults)
    assert all(_select(cfg, key) is False for key in RESHARD)
    assert f"{RESHARD[0]}: True -> False" in str(choices)
    # two processes shard for real; a value the user named stays
    cfg = _compose(["trainer.device=cpu", "trainer.n_gpus_per_node=2"])
    resolve_host_defaults(cfg, set(), defaults)
    assert all(_select(cfg, key) is True for key in RESHARD)
    cfg = _compose(["trainer.device=cpu", "trainer.n_gpus_per_node=1", f"{RESHARD[0]}=true"])
    resolve_host_defaults(cfg, {RESHARD[0]}, defaults)
    assert _select(cfg, RESHARD[0]) is True and _select(cfg, RESHARD[2]) is False


def test_samples_of_a_prompt_share_its_forward_on_cpu(monkeypatch, defaults):
    key = host_defaults.SHARE_PREFIX_KEY
    cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.rollout.n=4"])
    choices = resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, key) is True
    assert key in str(choices) and "rollout.n=4" in str(choices)
    # one sample per prompt: nothing to share
    cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.rollout.n=1"])
    resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, key) is False
    # set by the user, or a Megatron actor, or a GPU run: kept as it is
    cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.rollout.n=4", f"{key}=false"])
    resolve_host_defaults(cfg, {key}, defaults)
    assert _select(cfg, key) is False
    cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.strategy=megatron"])
    resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, key) is False
    monkeypatch.setattr(host_defaults, "resolve_device", lambda device: "cuda")
    cfg = _compose(["actor_rollout_ref.rollout.n=4"])
    resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, key) is False


def test_the_critic_shares_the_prompt_of_the_samples_when_the_run_has_one(defaults):
    key = host_defaults.CRITIC_SHARE_PREFIX_KEY
    cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=gae"])
    choices = resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, key) is True and key in str(choices)
    # no critic (GRPO), one sample per prompt, a Megatron critic, or the user's value: left as it is
    for overrides in (["algorithm.adv_estimator=grpo"], ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.n=1"],
                      ["algorithm.adv_estimator=gae", "critic.strategy=megatron"]):
        cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.rollout.n=4", *overrides])
        choices = resolve_host_defaults(cfg, set(), defaults)
        assert _select(cfg, key) is False and key not in str(choices), overrides
    cfg = _compose(["trainer.device=cpu", "actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=gae", f"{key}=false"])
    resolve_host_defaults(cfg, {key}, defaults)
    assert _select(cfg, key) is False


def test_the_block_names_a_onednn_cap(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert "(oneDNN capped at AVX2)" in host_defaults._cpu_isa()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert "capped" not in host_defaults._cpu_isa()


def test_an_enabled_reward_model_without_a_micro_batch_scores_in_log_prob_micro_batches(monkeypatch, defaults):
    # verl's reward-loop scripts (run_qwen2-7b_rm.sh ...) enable the reward model and set no micro batch for it
    monkeypatch.setattr(host_defaults, "resolve_device", lambda value: "cuda")  # on every device
    on = ["reward_model.enable=True", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16"]
    cfg = _compose(on)
    choices = resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, "reward_model.micro_batch_size_per_gpu") == 16
    assert any(c[0] == "reward_model.micro_batch_size_per_gpu" and c[2] == 16 for c in choices.changed)
    for kept in (on + ["reward_model.micro_batch_size_per_gpu=4"], on + ["reward_model.micro_batch_size=8"],
                 on[1:], on[:1]):  # set by the user, the global spelling, no reward model, nothing to take it from
        cfg = _compose(kept)
        before = _select(cfg, "reward_model.micro_batch_size_per_gpu")
        resolve_host_defaults(cfg, set(), defaults)
        assert _select(cfg, "reward_model.micro_batch_size_per_gpu") == before, kept


def test_a_key_that_follows_another_changes_with_it(monkeypatch, defaults):
    """A key written as ${...} of another is left to follow it: when the source changes it follows, and when the
    user set the source it keeps the user's value (no entry of its own in the block)."""
    from omegaconf import OmegaConf

    monkeypatch.setattr(host_defaults, "cpu_has_native_bf16", lambda: False)
    actor, ref = COMPUTE_DTYPE_KEYS[0], COMPUTE_DTYPE_KEYS[1]
    cfg = _compose(["trainer.device=cpu"])
    OmegaConf.update(cfg, ref, "${" + actor + "}")
    choices = resolve_host_defaults(cfg, set(), defaults)
    assert _select(cfg, actor) == "fp32" and _select(cfg, ref) == "fp32"
    assert OmegaConf.is_interpolation(cfg.actor_rollout_ref.ref.fsdp_config, "dtype")
    assert [c[0] for c in choices.changed].count(ref) == 0 and ref not in [k for k, _, _ in choices.kept]
    cfg = _compose(["trainer.device=cpu", f"{actor}=bfloat16"])
    OmegaConf.update(cfg, ref, "${" + actor + "}")
    choices = resolve_host_defaults(cfg, {actor}, defaults)
    assert _select(cfg, ref) == "bfloat16" and [k for k, _, _ in choices.kept].count(ref) == 0


def test_a_key_the_config_does_not_carry_is_not_added(defaults):
    """A recipe's yaml without a key (here the critic's compile switch): the host-aware values go to the keys it
    has, none is added."""
    from omegaconf import open_dict

    cfg = _compose(["trainer.device=cpu"])
    with open_dict(cfg):
        del cfg.critic.model.fsdp_config["use_torch_compile"]
    changes = host_defaults.resolve_torch_compile(cfg, "cpu", set(), defaults)
    assert "use_torch_compile" not in cfg.critic.model.fsdp_config
    assert {key for key, *_ in changes} == set(host_defaults.COMPILE_KEYS) - {
        "actor_rollout_ref.ref.use_torch_compile", "critic.model.fsdp_config.use_torch_compile"}
