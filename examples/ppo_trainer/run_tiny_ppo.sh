#!/usr/bin/env bash
# verl's quickstart PPO command line (GAE with a critic), scaled down to the embedded tiny model on CPU with the
# HF rollout. Starts from the SFT model of examples/sft/run_tiny_sft.sh when there is one (MODEL=... overrides).
#   bash examples/ppo_trainer/run_tiny_ppo.sh [key=value ...]
# fp32 compute: on CPU a 1M-parameter model runs ~15x slower in bf16 mixed precision.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../quickstart/tiny_assets.sh"
"$PY" -m verl.trainer.main_ppo \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=32 \
  data.max_prompt_length=32 \
  data.max_response_length=8 \
  data.dataloader_num_workers=0 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.enable_gradient_checkpointing=false \
  actor_rollout_ref.actor.fsdp_config.dtype=fp32 \
  actor_rollout_ref.ref.fsdp_config.dtype=fp32 \
  actor_rollout_ref.rollout.dtype=fp32 \
  critic.model.fsdp_config.dtype=fp32 \
  actor_rollout_ref.actor.optim.lr=1e-4 \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.name=hf \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
  critic.optim.lr=1e-3 \
  critic.model.path="$MODEL" \
  critic.model.enable_gradient_checkpointing=false \
  critic.ppo_micro_batch_size_per_gpu=16 \
  algorithm.kl_ctrl.kl_coef=0.001 \
  trainer.logger='[console]' \
  trainer.val_before_train=False \
  trainer.n_gpus_per_node=1 \
  trainer.nnodes=1 \
  trainer.save_freq=10 \
  trainer.test_freq=10 \
  trainer.total_epochs=15 \
  trainer.total_training_steps=20 \
  trainer.project_name=arith-ppo \
  trainer.experiment_name=tiny \
  trainer.default_local_dir="$HOME/checkpoints/arith-ppo" "$@" 2>&1 | tee "${LOG:-verl_demo.log}"
