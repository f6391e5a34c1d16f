"""Bad configs fail before Ray starts: one clear message naming the key, exit code 2, nothing written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tests.trainer.validator_assets import write_validator_assets
from verl.trainer.config_schema import validate_ppo_config
from verl.utils.config import ConfigError, check_overrides, flatten_keys as flat, suggest_keys

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "verl" / "trainer" / "config")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    write_validator_assets(root)
    return root


def good_overrides(assets):
    return [
        f"data.train_files={assets / 'train.parquet'}",
        f"data.val_files={assets / 'train.parquet'}",
        f"actor_rollout_ref.model.path={assets / 'model'}",
        f"critic.model.path={assets / 'model'}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # verl's default is 2; hf engines are one process
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=2",
        "trainer.logger=console",
    ]


def composed(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_good_config_passes_and_plans_roles(assets):
    plan = validate_ppo_config(composed(good_overrides(assets)))
    assert plan.device == "cpu"
    assert plan.n_gpus == 2
    assert plan.use_critic and not plan.use_reference_policy and not plan.use_rm
    assert plan.trainer.logger == ["console"]  # a single string is accepted
    assert plan.algorithm.kl_ctrl.type == "fixed"

    grpo = validate_ppo_config(composed(good_overrides(assets) + [
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.use_kl_loss=True"]))
    assert not grpo.use_critic and grpo.use_reference_policy


@pytest.mark.parametrize("extra, pattern", [
    (["data.train_batch_size=7"], r"data.train_batch_size \* actor_rollout_ref.rollout.n .* 2 worker ranks"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=3"], r"ppo_mini_batch_size"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"], r"multiple of actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size=4"], r"both 'actor_rollout_ref.actor.ppo_micro_batch_size' and"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"], r"set 'actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu'"),
    (["critic.ppo_micro_batch_size_per_gpu=null"], r"critic.ppo_micro_batch_size_per_gpu"),
    (["algorithm.adv_estimator=gpro"], r"algorithm.adv_estimator='gpro' is not one of: .*grpo"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=vanila"], r"loss_mode='vanila' is not one of: .*vanilla"),
    (["actor_rollout_ref.actor.kl_loss_type=k9"], r"kl_loss_type='k9' is not one of: kl, k1"),
    (["algorithm.kl_penalty=xx"], r"algorithm.kl_penalty='xx'"),
    (["actor_rollout_ref.rollout.name=trt"], r"rollout.name='trt' is not one of: hf, vllm, sglang"),
    (["actor_rollout_ref.ref.ulysses_sequence_parallel_size=2"], r"ref.ulysses_sequence_parallel_size=2 differs"),
    (["trainer.logger=[console,mlfow]"], r"trainer.logger='mlfow'"),
    (["trainer.resume_mode=resume_path"], r"resume_from_path"),
    (["data.train_files=/nonexistent/train.parquet"], r"data.train_files: file not found: /nonexistent/train.parquet"),
    (["critic.model.path=/nonexistent/critic"], r"critic.model.path: model not found: /nonexistent/critic"),
    (["trainer.device=cuda"], r"trainer.device=cuda"),
    (["actor_rollout_ref.actor.strategy=deepspeed"], r"strategy='deepspeed' is not one of"),
    (["algorithm.rollout_correction.rollout_is=tok"], r"rollout_correction.rollout_is='tok' is not one of: None, token"),
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=0"],
     r"rollout_is_threshold=0 must be a number > 0"),
    (["algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.bypass_mode=true"],
     r"rollout_is='sequence' with algorithm.rollout_correction.loss_type=ppo_clip needs "
     r"algorithm.rollout_correction.bypass_mode=false.*set algorithm.rollout_correction.loss_type=reinforce"),
    (["algorithm.rollout_correction.loss_type=reinforce"],
     r"loss_type=reinforce is bypass mode's loss: set algorithm.rollout_correction.bypass_mode=true"),
    (["algorithm.rollout_correction.loss_type=pg"], r"loss_type='pg' is not one of: ppo_clip, reinforce"),
    (["algorithm.rollout_correction.bypass_mode=maybe"], r"bypass_mode='maybe' must be true or false"),
    (["algorithm.rollout_correction.rollout_rs=token"], r"rollout_correction.rollout_rs='token' is not supported.*leave it null"),
    (["algorithm.rollout_correction.use_policy_gradient=true"], r"use_policy_gradient=True is not supported"),
    (["actor_rollout_ref.actor.old_log_prob_source=update"],  # mini-batches of 4 out of 8 prompts
     r"old_log_prob_source=update is exact only with one update per batch, but .*ppo_mini_batch_size=4 < "
     r"data.train_batch_size=8.*use actor_rollout_ref.actor.old_log_prob_source=trainer"),
    (["actor_rollout_ref.actor.old_log_prob_source=later"], r"old_log_prob_source='later' is not one of: trainer, update"),
    (["reward_model.sandbox_fusion.url=localhost:8080"],
     r"sandbox_fusion.url='localhost:8080' is not an http\(s\) URL.*leave it null to run programs in a local subprocess"),
    (["reward_model.sandbox_fusion.max_concurrent=0"], r"sandbox_fusion.max_concurrent=0 must be"),
])
def test_bad_values_raise_config_error(assets, extra, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate_ppo_config(composed(good_overrides(assets) + extra))


def test_rollout_correction_modes_pass(assets):
    for extra in (["algorithm.rollout_correction.bypass_mode=true"],
                  ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=5"]):
        plan = validate_ppo_config(composed(good_overrides(assets) + extra))
        assert plan.algorithm.rollout_correction["bypass_mode"] == ("bypass_mode" in extra[0])


def test_missing_rollout_name_is_explained(assets):
    overrides = [o for o in good_overrides(assets) if not o.startswith("actor_rollout_ref.rollout.name")]
    with pytest.raises(ConfigError, match=r"rollout.name is required: add actor_rollout_ref.rollout.name=hf"):
        validate_ppo_config(composed(overrides))


def test_model_path_not_checked_for_critic_without_gae(assets):
    cfg = composed(good_overrides(assets) + ["algorithm.adv_estimator=grpo", "critic.model.path=/nonexistent"])
    assert not validate_ppo_config(cfg).use_critic


def test_override_key_suggestions():
    base = composed([])
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.totl_epochs' \(did you mean 'trainer.total_epochs'"):
        check_overrides(base, ["trainer.totl_epochs=3"])
    with pytest.raises(ConfigError, match=r"did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'"):
        check_overrides(base, ["+actor_rollout_ref.actor.ppo_mini_bach_size=3"])
    with pytest.raises(ConfigError, match=r"already exists"):
        check_overrides(base, ["+trainer.total_epochs=3"])
    # free-form sections take new keys; unrelated new keys only warn
    assert check_overrides(base, ["+actor_rollout_ref.model.override_config.attn_implementation=eager"]) == []
    warnings = check_overrides(base, ["+trainer.my_recipe_flag=1"])
    assert len(warnings) == 1 and "my_recipe_flag" in warnings[0]
    assert suggest_keys("critic.optim.lrr", ["critic.optim.lr", "critic.optim.betas"]) == ["critic.optim.lr"]


def test_optional_schema_keys_can_be_added():
    """Keys the schema declares but the yaml does not carry (``rollout.seed``, ``rollout.num_threads``) are added
    with '+' like in verl; near-misses of them are still refused, and the value is checked with the config."""
    from verl.trainer.main_ppo import schema_keys

    base = composed([])
    known = schema_keys()
    assert "actor_rollout_ref.rollout.seed" in known and "actor_rollout_ref.rollout.seed" not in flat(base)
    assert check_overrides(base, ["+actor_rollout_ref.rollout.seed=3", "+actor_rollout_ref.rollout.num_threads=1"],
                           known=known) == []
    with pytest.raises(ConfigError, match="unknown config key 'actor_rollout_ref.rollout.sed'"):
        check_overrides(base, ["+actor_rollout_ref.rollout.sed=3"], known=known)
    with pytest.raises(ConfigError, match="unknown config key 'actor_rollout_ref.rollout.seed'"):
        check_overrides(base, ["+actor_rollout_ref.rollout.seed=3"])  # without the schema's keys: a near-miss


def test_every_bad_override_is_named_at_once():
    """A ported command line with several keys we do not know: one error names them all, good ones pass."""
    base = composed([])
    with pytest.raises(ConfigError) as err:
        check_overrides(base, ["trainer.totl_epochs=3", "trainer.total_epochs=2", "+trainer.total_epochs=4",
                               "actor_rollout_ref.actor.kl_loss.coef=0.1"])
    message = str(err.value)
    assert message.startswith("3 overrides are not accepted: (1) unknown config key 'trainer.totl_epochs'")
    assert "(2) 'trainer.total_epochs' already exists" in message
    assert "(3) unknown config key 'actor_rollout_ref.actor.kl_loss.coef'" in message and "\n" not in message


# ------------------------------------------------------------------------------------------- CLI (subprocess)

def run_cli(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled")
    return subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("case, extra, pattern", [
    ("misspelled", ["trainer.totl_epochs=3"], "did you mean 'trainer.total_epochs'"),
    ("misspelled_plus", ["+data.train_bach_size=3"], "did you mean 'data.train_batch_size'"),
    ("not_divisible", ["data.train_batch_size=7"], "is not divisible by 2"),
    ("missing_file", ["data.val_files=/nonexistent/val.parquet"], "data.val_files: file not found: /nonexistent/val.parquet"),
    ("unknown_estimator", ["algorithm.adv_estimator=ppo2"], "algorithm.adv_estimator='ppo2' is not one of"),
    ("bad_type", ["trainer.total_epochs=abc"], "total_epochs"),
])
def test_cli_config_errors_exit_2_and_write_nothing(assets, tmp_path, case, extra, pattern):
    cwd = tmp_path / case
    cwd.mkdir()
    proc = run_cli(good_overrides(assets) + ["trainer.logger=[console,file,tensorboard]"] + extra, cwd)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert pattern in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Config error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(cwd.iterdir()) == [], "a failed config must not write anything"


def test_cli_megatron_parallel_sizes_must_divide_the_processes(assets, tmp_path):
    proc = run_cli(["--config-name", "ppo_megatron_trainer"] + good_overrides(assets)
                   + ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "actor_rollout_ref.actor.megatron: tensor_model_parallel_size * pipeline_model_parallel_size" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_bf16_on_cpu_without_native_bf16_warns_with_the_keys(assets, monkeypatch, capsys):
    import verl.utils.device as device

    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    validate_ppo_config(composed(good_overrides(assets)))  # verl's defaults: bf16 compute everywhere
    out = capsys.readouterr().out
    assert "no native bf16" in out
    for key in ("actor_rollout_ref.actor.fsdp_config.dtype=fp32", "actor_rollout_ref.rollout.dtype=fp32",
                "critic.model.fsdp_config.dtype=fp32"):
        assert key in out, out
    assert "ref.fsdp_config" not in out  # no reference model in this config: not named
    fp32 = ["actor_rollout_ref.actor.fsdp_config.dtype=fp32", "actor_rollout_ref.rollout.dtype=fp32",
            "critic.model.fsdp_config.dtype=fp32"]
    validate_ppo_config(composed(good_overrides(assets) + fp32))
    assert "no native bf16" not in capsys.readouterr().out
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)  # AVX-512 BF16 / AMX: bf16 is the fast path
    validate_ppo_config(composed(good_overrides(assets)))
    assert "no native bf16" not in capsys.readouterr().out


def test_cpu_has_native_bf16_matches_cpu_flags(monkeypatch):
    from verl.utils.device import cpu_has_native_bf16

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)

    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    if not flags:
        pytest.skip("no /proc/cpuinfo flags line to compare with (not Linux x86)")
    expected = " avx512_bf16" in flags or " amx_bf16" in flags or " amx_tile" in flags
    assert cpu_has_native_bf16() == expected


def test_plan_config_has_the_hf_rollout_size_the_check_applies(assets):
    """verl's rollout default (tensor_model_parallel_size=2) becomes 1 for hf; the plan's typed config agrees
    with the config the check changed."""
    overrides = [o for o in good_overrides(assets) if not o.startswith("actor_rollout_ref.rollout.tensor_model")]
    cfg = composed(overrides)
    plan = validate_ppo_config(cfg, check_files=False)
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert plan.config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1


def test_megatron_check_reads_the_typed_view_it_is_given():
    """The Megatron check reads the typed view it is passed (the validator builds one), not the raw config."""
    from omegaconf import OmegaConf

    from verl.trainer.config_schema.megatron import check_megatron_config
    from verl.trainer.config_schema.validate import typed_ppo_config

    raw = OmegaConf.create({"critic": {"strategy": "fsdp", "megatron": {"tensor_model_parallel_size": 2}}})
    with pytest.raises(ConfigError, match=r"critic\.megatron\.tensor_model_parallel_size=2 applies to "
                                          r"strategy=megatron only, but critic\.strategy='fsdp'"):
        check_megatron_config(raw, check_files=False)
    check_megatron_config(raw, check_files=False, typed=typed_ppo_config(OmegaConf.create({})))


def test_share_prompt_prefix_is_an_fsdp_path(assets):
    overrides = good_overrides(assets) + ["actor_rollout_ref.actor.strategy=megatron",
                                          "actor_rollout_ref.model.share_prompt_prefix=true"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    with pytest.raises(ConfigError, match="share_prompt_prefix=true is not available with strategy=megatron"):
        validate_ppo_config(cfg, check_files=False)
    # the critic's own key, with a Megatron critic
    overrides = good_overrides(assets) + ["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron",
                                          "algorithm.adv_estimator=gae", "critic.model.share_prompt_prefix=true"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    with pytest.raises(ConfigError, match="critic.model.share_prompt_prefix=true is not available with strategy=meg"):
        validate_ppo_config(cfg, check_files=False)


@pytest.mark.parametrize("name", ["ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"])
def test_a_onednn_cap_below_bf16_means_no_native_bf16(monkeypatch, name):
    """oneDNN runs torch's bf16 matmuls on CPU: capped below the bf16 instructions it emulates them, whatever the
    CPU has, so the host-aware defaults must not take bf16 for the fast path."""
    from verl.utils import device

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(device.torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert device.cpu_has_native_bf16()
    monkeypatch.setenv(name, "avx2")
    assert device.onednn_isa_cap() == "AVX2" and not device.cpu_has_native_bf16()
    monkeypatch.setenv(name, "AVX512_CORE_BF16")  # a cap that keeps bf16
    assert device.cpu_has_native_bf16()
