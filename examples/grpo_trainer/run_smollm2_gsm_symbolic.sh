#!/usr/bin/env bash
# GRPO on a real pretrained model on a CPU machine: SmolLM2-135M-Instruct learns GSM-style word problems
# (reasoning-gym gsm_symbolic), vLLM rollout + FSDP2 training, greedy validation on the held-out test set.
#   bash examples/grpo_trainer/run_smollm2_gsm_symbolic.sh [key=value ...]
#   ALGO=ppo  bash examples/grpo_trainer/run_smollm2_gsm_symbolic.sh      # PPO with a critic (GAE) instead of GRPO
#   LORA_RANK=32 bash examples/grpo_trainer/run_smollm2_gsm_symbolic.sh   # LoRA adapters instead of full weights
#   ROLLOUT=hf bash examples/grpo_trainer/run_smollm2_gsm_symbolic.sh     # without vLLM
# The model and data are prepared on first use (MODEL_DIR, DATA_DIR choose where; nothing is downloaded from a
# model hub). Precision follows the CPU: bf16 where it is native (AVX-512 BF16 / AMX), else fp32 (emulated bf16
# is many times slower). Reward: GSM8K's strict rule (the number after '####' must equal the answer); the
# flexible rule (last number) is logged beside it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY=${PY:-python3}
[ -x "$ROOT/.venv/bin/python" ] && [ "$PY" = python3 ] && PY="$ROOT/.venv/bin/python"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
export VLLM_CPU_NUM_OF_RESERVED_CPU=${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}
MODEL_DIR=${MODEL_DIR:-$HOME/models/SmolLM2-135M-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm_symbolic}
ALGO=${ALGO:-grpo}
LORA_RANK=${LORA_RANK:-0}
ROLLOUT=${ROLLOUT:-vllm}
CKPT_DIR=${CKPT_DIR:-$HOME/checkpoints/smollm2-gsm-symbolic-$ALGO}

[ -f "$MODEL_DIR/model.safetensors" ] || "$PY" "$ROOT/examples/models/prepare_smollm2.py" --out "$MODEL_DIR"
[ -f "$DATA_DIR/test.parquet" ] || "$PY" "$ROOT/examples/data_preprocess/gsm_symbolic.py" \
  --local_save_dir "$DATA_DIR" --train_size 2000 --test_size 200

if "$PY" -c "import sys; from verl.utils.device import cpu_has_native_bf16; sys.exit(0 if cpu_has_native_bf16() else 1)"; then
  DTYPE=bf16; ROLLOUT_DTYPE=bfloat16
else
  DTYPE=fp32; ROLLOUT_DTYPE=float32
fi
echo "[run_smollm2] algorithm=$ALGO lora_rank=$LORA_RANK rollout=$ROLLOUT precision=$DTYPE model=$MODEL_DIR data=$DATA_DIR"

ALGO_ARGS=()
case "$ALGO" in
  grpo) ALGO_ARGS=(algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=4) ;;
  ppo)  ALGO_ARGS=(algorithm.adv_estimator=gae actor_rollout_ref.rollout.n=1
                   critic.model.path="$MODEL_DIR" critic.model.enable_gradient_checkpointing=false
                   critic.model.fsdp_config.dtype=$DTYPE critic.optim.lr=1e-5
                   critic.ppo_micro_batch_size_per_gpu=8 trainer.critic_warmup=0) ;;
  *) echo "ALGO must be grpo or ppo, got '$ALGO'" >&2; exit 2 ;;
esac
LR=${LR:-2e-6}
if [ "$LORA_RANK" -gt 0 ]; then
  LR=${LORA_LR:-2e-5}  # adapters start at zero and need a larger step than full fine-tuning
  ALGO_ARGS+=(actor_rollout_ref.model.lora_rank="$LORA_RANK" actor_rollout_ref.model.lora_alpha="$((2 * LORA_RANK))"
              actor_rollout_ref.model.target_modules=all-linear)
fi

"$PY" -m verl.trainer.main_ppo \
  "${ALGO_ARGS[@]}" \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/test.parquet" \
  data.train_batch_size=8 \
  data.max_prompt_length=256 \
  data.max_response_length=256 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  data.dataloader_num_workers=0 \
  actor_rollout_ref.model.path="$MODEL_DIR" \
  actor_rollout_ref.model.use_remove_padding=True \
  actor_rollout_ref.model.enable_gradient_checkpointing=false \
  actor_rollout_ref.actor.fsdp_config.dtype=$DTYPE \
  actor_rollout_ref.ref.fsdp_config.dtype=$DTYPE \
  actor_rollout_ref.actor.optim.lr="$LR" \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.use_kl_loss=False \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.rollout.name="$ROLLOUT" \
  actor_rollout_ref.rollout.dtype=$ROLLOUT_DTYPE \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.max_num_seqs=64 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  algorithm.use_kl_in_reward=False \
  custom_reward_function.path="$ROOT/verl/utils/reward_score/gsm8k.py" \
  custom_reward_function.name=compute_score_strict_and_flexible \
  algorithm.rollout_correction.bypass_mode=True \
  trainer.logger='[console,file]' \
  trainer.val_before_train=True \
  trainer.n_gpus_per_node=1 \
  trainer.nnodes=1 \
  trainer.save_freq=-1 \
  trainer.test_freq=10 \
  trainer.total_epochs=1 \
  trainer.total_training_steps=40 \
  trainer.project_name=smollm2-gsm-symbolic \
  trainer.experiment_name="$ALGO-lora$LORA_RANK" \
  trainer.default_local_dir="$CKPT_DIR" "$@"
