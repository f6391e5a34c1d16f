#!/usr/bin/env bash
# GRPO on a tiny vision-language model (Qwen2-VL architecture, random weights) with images in the prompts: the
# embedded colour task (name the colour of the square in the picture), HF rollout, fp32 on CPU.
#   bash examples/grpo_trainer/run_tiny_vlm_colours.sh [key=value ...]
# The model and data are built offline on first use (MODEL_DIR, DATA_DIR choose where). See docs/multimodal.md.
# The model starts from random weights: its first answers name no colour, and the reward's small shaping term
# (characters of the right colour's name) is what GRPO learns from first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY=${PY:-python3}
[ -x "$ROOT/.venv/bin/python" ] && [ "$PY" = python3 ] && PY="$ROOT/.venv/bin/python"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
MODEL_DIR=${MODEL_DIR:-$HOME/models/vlm-tiny}
DATA_DIR=${DATA_DIR:-$HOME/data/colours}

[ -f "$MODEL_DIR/model.safetensors" ] || "$PY" -m verl.utils.embedded.vlm --out "$MODEL_DIR"
[ -f "$DATA_DIR/test.parquet" ] || "$PY" -m verl.utils.embedded.colours --local_dir "$DATA_DIR" \
  --train_size 256 --test_size 32

"$PY" -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \
  data.train_files="$DATA_DIR/train.parquet" data.val_files="$DATA_DIR/test.parquet" \
  data.image_key=images data.train_batch_size=16 data.max_prompt_length=64 data.max_response_length=8 \
  actor_rollout_ref.model.path="$MODEL_DIR" \
  actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.actor.use_kl_loss=False \
  actor_rollout_ref.actor.fsdp_config.dtype=fp32 \
  actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
  custom_reward_function.path="$ROOT/verl/utils/embedded/colours.py" algorithm.use_kl_in_reward=False \
  trainer.logger='[console]' trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.save_freq=-1 \
  trainer.test_freq=10 trainer.total_training_steps=40 "$@"
