#!/usr/bin/env bash
# SFT warm start of the embedded tiny model on the arithmetic task (CPU, about 2-4 minutes).
#   bash examples/sft/run_tiny_sft.sh [key=value ...]                   # one process
#   NPROC=2 bash examples/sft/run_tiny_sft.sh [key=value ...]           # torchrun, 2 processes (verl's way)
# Writes $SFT_DIR/global_step_<N>/huggingface: pass that directory as actor_rollout_ref.model.path.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../quickstart/tiny_assets.sh"
NPROC="${NPROC:-1}"
if [ "$NPROC" -gt 1 ]; then
  LAUNCH=("$PY" -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node="$NPROC")
else
  LAUNCH=("$PY")
fi
"${LAUNCH[@]}" -m verl.trainer.fsdp_sft_trainer \
  data.train_files="$DATA/sft/train.parquet" \
  data.val_files="$DATA/sft/test.parquet" \
  data.prompt_key=prompt \
  data.response_key=response \
  data.max_length=32 \
  data.train_batch_size=64 \
  data.micro_batch_size_per_gpu=$((64 / NPROC)) \
  model.partial_pretrain="$BASE_MODEL" \
  model.enable_gradient_checkpointing=false \
  optim.lr=3e-3 \
  optim.lr_warmup_steps_ratio=0.05 \
  trainer.total_training_steps=120 \
  trainer.test_freq=30 \
  trainer.logger='[console]' \
  trainer.project_name=arith-sft \
  trainer.experiment_name=tiny \
  trainer.default_local_dir="$SFT_DIR" \
  trainer.device=auto "$@"
