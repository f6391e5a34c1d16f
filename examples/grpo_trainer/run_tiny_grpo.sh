#!/usr/bin/env bash
# GRPO (n=4 samples per prompt, KL loss against the reference policy) on the embedded tiny model with the vLLM
# CPU rollout. Starts from the SFT model of examples/sft/run_tiny_sft.sh when there is one (MODEL=... overrides).
#   bash examples/grpo_trainer/run_tiny_grpo.sh [key=value ...]
#   ROLLOUT=hf bash examples/grpo_trainer/run_tiny_grpo.sh        # without vLLM
# fp32 compute: on CPU a 1M-parameter model runs ~15x slower in bf16 mixed precision.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../quickstart/tiny_assets.sh"
"$PY" -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=32 \
  data.max_prompt_length=32 \
  data.max_response_length=8 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  data.dataloader_num_workers=0 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.use_remove_padding=True \
  actor_rollout_ref.model.enable_gradient_checkpointing=false \
  actor_rollout_ref.actor.fsdp_config.dtype=fp32 \
  actor_rollout_ref.ref.fsdp_config.dtype=fp32 \
  actor_rollout_ref.rollout.dtype=fp32 \
  actor_rollout_ref.actor.optim.lr=1e-4 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.name="${ROLLOUT:-vllm}" \
  actor_rollout_ref.rollout.n=4 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64 \
  algorithm.use_kl_in_reward=False \
  trainer.critic_warmup=0 \
  trainer.logger='[console]' \
  trainer.val_before_train=True \
  trainer.n_gpus_per_node=1 \
  trainer.nnodes=1 \
  trainer.save_freq=-1 \
  trainer.test_freq=10 \
  trainer.total_epochs=15 \
  trainer.total_training_steps=20 \
  trainer.project_name=arith-grpo \
  trainer.experiment_name=tiny \
  trainer.default_local_dir="$HOME/checkpoints/arith-grpo" "$@"
