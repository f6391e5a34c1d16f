"""Supervised fine-tuning with FSDP2: ``python -m verl.trainer.fsdp_sft_trainer key=value ...``.

Two ways to launch (config: ``verl/trainer/config/sft_trainer.yaml``, verl's keys)::

    # one process (world size 1: the trainer creates its own one-member process group)
    python -m verl.trainer.fsdp_sft_trainer data.train_files=... model.partial_pretrain=...
    # N processes, verl's way (torchrun sets RANK / WORLD_SIZE / MASTER_ADDR ...)
    torchrun --standalone --nnodes=1 --nproc_per_node=N -m verl.trainer.fsdp_sft_trainer ...

What it does, and the key that controls each part:

- data: ``SFTDataset`` (prompt/response columns: ``data.prompt_key``, ``data.response_key``) or
  ``MultiTurnSFTDataset`` (``data.multiturn.enable=True``), or your class (``data.custom_cls.{path,name}``).
  Each row gives ``input_ids``, ``attention_mask``, ``position_ids`` and ``loss_mask`` (1 on the response
  tokens themselves, token-aligned: a custom dataset must follow the same convention);
  ``data.max_length`` / ``data.truncation`` bound the length. Padding columns are cut per micro-batch (trimmed,
  or packed with flash attention: the results are the same, the compute is not wasted).
- batches: ``data.train_batch_size`` rows (all processes together) per optimizer step, split into
  micro-batches of ``data.micro_batch_size_per_gpu`` rows per process whose gradients accumulate.
- loss: next-token cross-entropy on the response tokens only, summed and divided by the number of response
  tokens in the whole global batch. This makes the loss (and the update) independent of how the batch is split
  into processes and micro-batches: 1 process and 2 processes give the same numbers (verl's
  ``data.balance_dp_token`` aims at the same effect; here it is always on).
- engine: the same training engine as the PPO roles (``verl.workers.engine``); the SFT loss is a loss function
  handed to it.
- model: ``model.partial_pretrain`` (a local HF dir) in ``model.fsdp_config.model_dtype``, sharded with FSDP2;
  ``model.lora_rank > 0`` trains LoRA adapters (``lora_alpha``, ``target_modules``);
  ``model.enable_gradient_checkpointing``.
- optimizer: AdamW (``optim.lr``, ``betas``, ``weight_decay``), linear warm-up over
  ``optim.lr_warmup_steps_ratio`` of the steps, then ``optim.lr_scheduler`` (cosine | constant);
  gradient-norm clipping at ``optim.clip_grad`` (a non-finite norm skips the step).
- length: ``trainer.total_epochs`` epochs, or exactly ``trainer.total_training_steps`` steps when set.
- validation: loss on ``data.val_files`` after every epoch and every ``trainer.test_freq`` steps (``val/loss``).
- logging: ``trainer.logger`` backends via ``verl.utils.tracking.Tracking`` (``train/loss``, ``train/lr(1e-3)``,
  ``train/grad_norm``, ``val/loss``).
- saving: every ``trainer.save_freq`` steps and after the last step, rank 0 writes a complete Hugging Face
  model directory (config, safetensors, tokenizer; LoRA merged), atomically, at
  ``<trainer.default_local_dir>/global_step_<N>/huggingface`` and records N in
  ``latest_checkpointed_iteration.txt``. Pass that ``huggingface`` directory to main_ppo as
  ``actor_rollout_ref.model.path``. ``trainer.max_ckpt_to_keep`` prunes older steps. When the checkpoint manager
  (``verl.utils.checkpoint``) is available, the sharded model/optimizer/extra state is saved beside it too and
  ``trainer.resume_mode=auto|resume_path`` resumes from it.
- device: ``trainer.device=auto`` picks cuda, npu or cpu (gloo); on CPU each process gets its share of cores.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import sys
import time

import hydra
import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.data import DataLoader, DistributedSampler, default_collate
from transformers import AutoTokenizer

from verl.protocol import DataProto
from verl.single_controller.base.worker import get_free_port
from verl.trainer.check_config import check_config_if_asked, compose_cli, split_cli
from verl.trainer.sft.config import SFTPlan, check_sequence_parallel_model, typed_sft_config, validate_sft_config
from verl.utils.checkpoint.hf_export import HF_SUBDIR, latest_step, mark_latest, prune_checkpoints, step_dir
from verl.utils.config import ConfigError, check_overrides
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
from verl.utils.dataset.sft_dataset import SFTDataset
from verl.utils.device import collective_device, get_device, get_dist_backend, resolve_device, set_device
from verl.utils.fs import copy_to_local
from verl.utils.import_utils import import_external_libs, load_extern_type
from verl.utils.model import check_model_dir, print_model_size
from verl.utils.tracking import Tracking
from verl.workers.config.data import SFTDataConfig, as_data_config
from verl.workers.engine import MicroBatchSpec, TrainSpec, get_engine_cls
from verl.workers.engine.config import sft_engine_config

EXIT_CONFIG_ERROR = 2

__all__ = ["FSDPSFTTrainer", "create_sft_dataset", "run_sft", "main", "sft_batch", "sft_loss"]


# ------------------------------------------------------------------------------------------------ process group
def initialize_global_process_group(device: str) -> tuple[int, int, int]:
    """(local_rank, rank, world_size). Under torchrun the env is set; a plain process becomes a group of one."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(get_free_port("127.0.0.1")))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if not dist.is_initialized():
        backend = get_dist_backend(device)
        if device != "cpu":  # gloo for CPU tensors (e.g. metrics), the accelerator's backend for the rest
            backend = f"cpu:gloo,{device}:{backend}"
            set_device(local_rank)
        dist.init_process_group(backend=backend)
    return local_rank, dist.get_rank(), dist.get_world_size()


def _set_cpu_threads() -> None:
    """Give each process its share of the cores (unless the user set OMP_NUM_THREADS)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // per_node))


# ------------------------------------------------------------------------------------------------ data
def create_sft_dataset(data_paths, data_config, tokenizer, max_samples: int = -1):
    """``data.custom_cls`` if set, else ``MultiTurnSFTDataset`` (``data.multiturn.enable``) or ``SFTDataset``."""
    typed = as_data_config(data_config, SFTDataConfig)
    if typed.custom_cls.path:
        dataset_cls = load_extern_type(typed.custom_cls.path, typed.custom_cls.name)
    elif typed.multiturn.enable:
        dataset_cls = MultiTurnSFTDataset
    else:
        dataset_cls = SFTDataset
    kwargs = dict(parquet_files=data_paths, tokenizer=tokenizer, config=data_config)
    if "max_samples" in inspect.signature(dataset_cls.__init__).parameters:
        kwargs["max_samples"] = max_samples
    dataset = dataset_cls(**kwargs)
    if max_samples is not None and max_samples > 0 and "max_samples" not in kwargs and len(dataset) > max_samples:
        dataset = torch.utils.data.Subset(dataset, range(max_samples))
    return dataset


def sft_batch(batch: dict) -> DataProto:
    """A collated SFT batch in the engine's response convention: every next-token prediction is a "response"
    position (``responses = input_ids[:, 1:]``), weighted by ``loss_mask[:, 1:]``.

    ``loss_mask[t] = 1`` means token ``t`` is a response token (the datasets' convention), so the loss of
    predicting ``input_ids[:, 1:]`` from the logits at ``[:, :-1]`` is weighted by ``loss_mask[:, 1:]``.
    The columns after the last one that holds a valid token in some row are padding in every row: they are cut
    (a causal model's outputs on the earlier columns do not depend on them, so the loss is the same).
    """
    attention_mask = batch["attention_mask"]
    used = attention_mask.bool().any(0).nonzero()
    width = max(int(used.max()) + 1 if used.numel() else 0, 2)  # at least one prediction per row
    cut = {k: batch[k][:, :width] for k in ("input_ids", "attention_mask", "position_ids", "loss_mask")}
    input_ids = cut["input_ids"]
    return DataProto.from_dict({
        "input_ids": input_ids, "attention_mask": cut["attention_mask"], "position_ids": cut["position_ids"],
        "responses": input_ids[:, 1:], "response_mask": cut["loss_mask"][:, 1:].to(torch.float32),
    })


def sft_loss(outputs: dict, micro, ctx) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy, mean over the micro-batch's response tokens (the engine weights micro-batches
    by their share of the global batch's tokens, so the step is d(total loss / total tokens))."""
    mask = micro["response_mask"].to(outputs["log_probs"].dtype)
    loss_sum = -(outputs["log_probs"] * mask).sum()
    return loss_sum / mask.sum().clamp(min=1.0), {"sft/loss_sum": loss_sum}


def _all_reduce_sum(*values: float | torch.Tensor, group=None) -> list[float]:
    """Sums over ``group`` (default: all processes). With sequence parallelism the ranks of one group hold the
    same rows, so totals over rows are summed over the data-parallel group only."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        t = t.to(collective_device(group))
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.cpu().tolist()


# ------------------------------------------------------------------------------------------------ trainer
class FSDPSFTTrainer:
    """The SFT recipe: ``__init__`` checks the config and builds data, model and optimizer; ``fit()`` trains."""

    def __init__(self, config: DictConfig, device_mesh, tokenizer, train_dataset, val_dataset=None,
                 plan: SFTPlan | None = None, ulysses_device_mesh=None):
        self.config = config
        self.device_mesh = device_mesh
        self.tokenizer = tokenizer
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.plan = plan or validate_sft_config(config, self.world_size, device=os.environ.get("VERL_DEVICE", "cpu"))
        self.typed_config = self.plan.config  # the config the code reads (typed, frozen); self.config as given
        # ulysses_sequence_parallel_size: ranks [g*sp, (g+1)*sp) work on the same rows (data-parallel group g)
        self.dp_rank, self.dp_size = self.rank // self.plan.sp_size, self.plan.dp_size
        self.device = get_device(int(os.environ.get("LOCAL_RANK", 0)))
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self._build_dataloader()
        self._build_model_optimizer()

    # ---------------------------------------------------------------- setup
    def _build_dataloader(self) -> None:
        plan = self.plan
        if len(self.train_dataset) < plan.global_batch_size:
            raise ConfigError(
                f"data.train_batch_size={plan.global_batch_size} is larger than the training set "
                f"({len(self.train_dataset)} rows in data.train_files): lower data.train_batch_size"
            )
        self.train_sampler = DistributedSampler(
            self.train_dataset, num_replicas=self.dp_size, rank=self.dp_rank, shuffle=True,
            seed=int(self.typed_config.trainer.seed), drop_last=True,
        )
        self.train_dataloader = DataLoader(
            self.train_dataset, batch_size=plan.batch_size_per_rank, sampler=self.train_sampler,
            num_workers=0, drop_last=True,
        )
        self.steps_per_epoch = len(self.train_dataloader)
        total = self.typed_config.trainer.total_training_steps
        self.total_steps = int(total) if total else self.steps_per_epoch * int(self.typed_config.trainer.total_epochs)
        if self.rank == 0:
            micro = self.micro_batch_spec()
            passes = (f"micro-batches of up to {micro.max_token_len} tokens" if micro.use_dynamic_bsz
                      else f"{plan.grad_accum_steps} micro-batches of {plan.micro_batch_size_per_rank}")
            print(f"SFT: {len(self.train_dataset)} train rows, {self.steps_per_epoch} steps/epoch, "
                  f"{self.total_steps} steps, {self.world_size} process(es) x {passes}"
                  + (f" (sequence parallel: {self.dp_size} groups of {plan.sp_size})" if plan.sp_size > 1 else ""),
                  flush=True)

    def _val_batches(self):
        """This data-parallel group's share of the validation rows (g::groups), padded to equal counts with weight-0
        rows, so every rank runs the same number of forward passes (FSDP collectives) and no row counts twice."""
        n = len(self.val_dataset)
        per_rank = math.ceil(n / self.dp_size)
        idx = list(range(self.dp_rank, n, self.dp_size))
        weights = [1] * len(idx) + [0] * (per_rank - len(idx))
        idx += [0] * (per_rank - len(idx))
        mbs = self.plan.micro_batch_size_per_rank
        for start in range(0, per_rank, mbs):
            rows = [self.val_dataset[i] for i in idx[start:start + mbs]]
            batch = default_collate(rows)
            w = torch.tensor(weights[start:start + mbs], dtype=batch["loss_mask"].dtype).unsqueeze(1)
            batch["loss_mask"] = batch["loss_mask"] * w
            yield batch

    def _build_model_optimizer(self) -> None:
        """The training engine (``verl.workers.engine``): model, LoRA, FSDP2, optimizer and LR schedule."""
        model = self.typed_config.model
        import_external_libs(model.external_lib)
        local_path = copy_to_local(model.partial_pretrain, use_shm=bool(model.use_shm))
        engine_config = self.engine_config(local_path)
        self.engine = get_engine_cls(engine_config.strategy).build(engine_config, self.device_mesh,
                                                                  tokenizer=self.tokenizer)
        self.dp_group = getattr(self.engine, "dp_group", None)
        if self.rank == 0:
            print_model_size(self.engine.module)

    def engine_config(self, local_path: str):
        """What the engine builds, from this yaml's keys (``verl.trainer.sft_trainer`` builds it from verl 0.7's
        engine layout instead)."""
        return dataclasses.replace(sft_engine_config(self.config, local_path, self.total_steps),
                                   use_remove_padding=bool(self.typed_config.use_remove_padding),
                                   ulysses_sequence_parallel_size=self.plan.sp_size)

    def micro_batch_spec(self) -> MicroBatchSpec:
        """How this rank's rows are cut into forward passes: ``data.micro_batch_size_per_gpu`` rows each."""
        return MicroBatchSpec(self.plan.micro_batch_size_per_rank)

    def tracked_config(self) -> dict:
        """The config the loggers record with the run (the user's layout)."""
        return OmegaConf.to_container(self.config, resolve=True)

    def _checkpoint_contents(self) -> set:
        return set(self.typed_config.trainer.checkpoint.save_contents or []) & {"model", "optimizer", "extra"}

    # ---------------------------------------------------------------- steps
    def training_step(self, batch: dict) -> dict:
        """One optimizer step over this rank's share of the global batch; returns metrics (same on every rank)."""
        data = sft_batch(batch)
        (global_tokens,) = _all_reduce_sum(data.batch["response_mask"].sum(), group=self.dp_group)
        if global_tokens == 0:
            raise RuntimeError("this batch has no response tokens: check data.response_key / data.max_length / truncation")
        spec = TrainSpec(mini_batch_size=len(data), micro=self.micro_batch_spec(),
                         weight_by="tokens", outputs=("log_probs",), reduce_grads_once=True,
                         grad_norm_key="train/grad_norm")
        metrics = self.engine.train_batch(data, sft_loss, spec)
        lr = self.engine.lr_scheduler_step()
        (total_loss,) = _all_reduce_sum(sum(metrics["sft/loss_sum"]), group=self.dp_group)
        return {"train/loss": total_loss / global_tokens, "train/lr(1e-3)": lr * 1e3,
                "train/grad_norm": metrics["train/grad_norm"][0]}

    def validation_loss(self) -> float | None:
        """Mean response-token loss over the whole validation set (exact, whatever the number of processes)."""
        if self.val_dataset is None or len(self.val_dataset) == 0:
            return None
        loss_sum = tokens = 0.0
        micro = self.micro_batch_spec()
        for batch in self._val_batches():
            data = sft_batch(batch)
            log_probs = self.engine.infer(data, ("log_probs",), micro)["log_probs"]
            mask = data.batch["response_mask"].to(log_probs.dtype)
            loss_sum -= float((log_probs * mask).sum())
            tokens += float(mask.sum())
        loss_sum, tokens = _all_reduce_sum(loss_sum, tokens, group=self.dp_group)
        return loss_sum / max(tokens, 1.0)

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, step: int) -> str:
        """HF model dir at ``global_step_<step>/huggingface`` (+ resumable state when available); returns its path."""
        root = os.path.expanduser(self.typed_config.trainer.default_local_dir)
        path = step_dir(root, step)
        if self._checkpoint_contents():
            self.engine.save_checkpoint(path, global_step=step)
        hf_dir = os.path.join(path, HF_SUBDIR)
        self.engine.save_hf_model(hf_dir, self.tokenizer)
        if self.rank == 0:
            mark_latest(root, step)
            prune_checkpoints(root, self.typed_config.trainer.max_ckpt_to_keep)
            print(f"saved Hugging Face model to {hf_dir} (use it as actor_rollout_ref.model.path)", flush=True)
        if dist.is_initialized():
            dist.barrier()
        return hf_dir

    def _resume(self) -> int:
        """The step to start from (0 = fresh), after loading a saved state when resume is asked for and possible."""
        tr = self.typed_config.trainer
        if tr.resume_mode == "disable":
            return 0
        if tr.resume_mode == "resume_path":
            path = os.path.expanduser(tr.resume_from_path)
            name = os.path.basename(os.path.normpath(path))
            if not name.startswith("global_step_") or not os.path.isdir(path):
                raise ConfigError(f"trainer.resume_from_path={tr.resume_from_path!r} must be an existing global_step_<N> directory")
            step = int(name.split("_")[-1])
        else:
            step = latest_step(tr.default_local_dir)
            if step is None:
                return 0
            path = step_dir(os.path.expanduser(tr.default_local_dir), step)
        if not self._checkpoint_contents():
            raise ConfigError(
                f"found a checkpoint at {path} but trainer.checkpoint.save_contents has no model/optimizer/extra "
                "state to resume from; set trainer.resume_mode=disable to start over"
            )
        self.engine.load_checkpoint(path)
        if self.rank == 0:
            print(f"resumed from {path} (step {step})", flush=True)
        return step

    # ---------------------------------------------------------------- loop
    def fit(self) -> dict:
        """Train for ``total_steps``; returns the last metrics (with ``val/loss`` if validation ran)."""
        tr = self.typed_config.trainer
        tracker = None
        if self.rank == 0:
            loggers = [tr.logger] if isinstance(tr.logger, str) else list(tr.logger)
            tracker = Tracking(tr.project_name, tr.experiment_name, default_backend=loggers,
                               config=self.tracked_config())
        global_step = self._resume()
        test_freq, save_freq = int(tr.test_freq or -1), int(tr.save_freq or -1)
        last_metrics: dict = {}
        epoch = global_step // self.steps_per_epoch
        skip = global_step % self.steps_per_epoch
        while global_step < self.total_steps:
            self.train_sampler.set_epoch(epoch)
            for i, batch in enumerate(self.train_dataloader):
                if i < skip:
                    continue
                t0 = time.time()
                metrics = self.training_step(batch)
                global_step += 1
                metrics.update({"train/epoch": epoch, "timing_s/step": time.time() - t0})
                last_step = global_step >= self.total_steps
                end_of_epoch = i == self.steps_per_epoch - 1
                if (test_freq > 0 and global_step % test_freq == 0) or end_of_epoch or last_step:
                    val = self.validation_loss()
                    if val is not None:
                        metrics["val/loss"] = val
                if tracker is not None:
                    tracker.log(metrics, step=global_step)
                last_metrics = metrics
                if last_step or (save_freq > 0 and global_step % save_freq == 0):
                    self.save_checkpoint(global_step)
                if last_step:
                    break
            skip = 0
            epoch += 1
        if tracker is not None:
            tracker.finish()
        return last_metrics


# ------------------------------------------------------------------------------------------------ entry
def load_tokenizer(path: str, trust_remote_code: bool = False, chat_template: str | None = None):
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer


def preflight(config: DictConfig, world_size: int) -> tuple[str, SFTPlan, str]:
    """Every check before anything starts (what ``--check-config`` runs): the device, the schema and batch
    arithmetic, the input files, the model directory and its heads for sequence parallelism. Returns
    ``(device, plan, local model path)``; raises ConfigError naming the key."""
    try:
        device = resolve_device(typed_sft_config(config).trainer.device)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    plan = validate_sft_config(config, world_size, device)
    try:
        model_path = check_model_dir(copy_to_local(config.model.partial_pretrain))
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"model.partial_pretrain: {e}") from None
    check_sequence_parallel_model(config, model_path)
    return device, plan, model_path


def run_sft(config: DictConfig) -> dict:
    """Validate, set up the process group, build datasets and train. Returns the last metrics."""
    device, plan, model_path = preflight(config, int(os.environ.get("WORLD_SIZE", 1)))
    os.environ["VERL_DEVICE"] = device  # every device question in this process follows trainer.device
    if device == "cpu":
        _set_cpu_threads()
    local_rank, rank, world_size = initialize_global_process_group(device)
    try:
        device_mesh = init_device_mesh(device, mesh_shape=(world_size,), mesh_dim_names=("fsdp",))
        typed = plan.config
        tokenizer = load_tokenizer(model_path, bool(typed.model.trust_remote_code), typed.data.chat_template)
        data = config.data  # as given: a custom dataset class may read keys of its own
        train_dataset = create_sft_dataset(plan.train_files, data, tokenizer, int(typed.data.train_max_samples))
        val_dataset = (create_sft_dataset(plan.val_files, data, tokenizer, int(typed.data.val_max_samples))
                       if plan.val_files else None)
        trainer = FSDPSFTTrainer(config, device_mesh, tokenizer, train_dataset, val_dataset, plan=plan)
        return trainer.fit()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@hydra.main(config_path="config", config_name="sft_trainer", version_base=None)
def main(config: DictConfig) -> None:
    try:
        run_sft(config)
    except ConfigError as e:
        print(f"Config error: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG_ERROR)


CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
_CHOICE_FLAGS = ("--config-name", "-cn", "--config-path", "-cp")


def _check_cli_overrides(argv: list[str], config_name: str = "sft_trainer") -> None:
    """Unknown / misspelled keys on the command line: a ConfigError with a "did you mean" hint, before Hydra
    composes the config."""
    if any(a.startswith("-") and a.partition("=")[0] not in _CHOICE_FLAGS for a in argv):
        return  # --help, --cfg ...: leave to Hydra
    config_dir, config_name, overrides = split_cli(argv, CONFIG_DIR, config_name)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        for warning in check_overrides(compose(config_name=config_name), overrides):
            print(warning, file=sys.stderr)


def _precheck_cli(argv: list[str], config_name: str = "sft_trainer") -> None:
    """:func:`_check_cli_overrides` for the command line: a problem prints the ``Config error:`` line, exit 2."""
    try:
        _check_cli_overrides(argv, config_name)
    except ConfigError as e:
        print(f"Config error: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG_ERROR)


def check_command_line(argv: list[str]) -> DictConfig:
    """What ``python -m verl.trainer.fsdp_sft_trainer --check-config key=value ...`` checks, in this process: the
    command-line check, the composition and every check ``run_sft`` makes before it starts the process group
    (:func:`preflight`). ``argv``: the command line without the flag. Returns the config; raises ConfigError
    naming the key. Loads no model, writes nothing.

    The number of processes is torchrun's (``WORLD_SIZE``): run the check under the same torchrun command as the
    training (or set ``WORLD_SIZE=N``); a plain ``python -m`` checks one process."""
    _check_cli_overrides(argv)
    config = compose_cli(argv, CONFIG_DIR, "sft_trainer")
    preflight(config, int(os.environ.get("WORLD_SIZE", 1)))
    return config


if __name__ == "__main__":
    check_config_if_asked(check_command_line)  # --check-config: check, print ``config ok`` / the error, exit 0 / 2
    _precheck_cli(sys.argv[1:])
    main()
