#!/usr/bin/env bash
# SFT warm start of SmolLM2-135M-Instruct on gsm_symbolic's worked solutions (each ends in "#### N"), so that
# GRPO afterwards starts from a policy that answers in the rewarded format. CPU, one process.
#   bash examples/sft/run_smollm2_gsm_symbolic_sft.sh [key=value ...]
# Writes $SFT_DIR/global_step_<N>/huggingface; pass it to the GRPO script:
#   MODEL_DIR=$SFT_DIR/global_step_<N>/huggingface bash examples/grpo_trainer/run_smollm2_gsm_symbolic.sh
# Same prompts as the RL data (chat template + GSM8K instruction); the response is extra_info.answer.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY=${PY:-python3}
[ -x "$ROOT/.venv/bin/python" ] && [ "$PY" = python3 ] && PY="$ROOT/.venv/bin/python"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
BASE_MODEL=${BASE_MODEL:-$HOME/models/SmolLM2-135M-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm_symbolic}
SFT_DIR=${SFT_DIR:-$HOME/checkpoints/smollm2-gsm-symbolic-sft}
STEPS=${STEPS:-60}

[ -f "$BASE_MODEL/model.safetensors" ] || "$PY" "$ROOT/examples/models/prepare_smollm2.py" --out "$BASE_MODEL"
[ -f "$DATA_DIR/test.parquet" ] || "$PY" "$ROOT/examples/data_preprocess/gsm_symbolic.py" \
  --local_save_dir "$DATA_DIR" --train_size 2000 --test_size 200
"$PY" -c "import pandas as p, sys; r = p.read_parquet(sys.argv[1]).extra_info[0]; sys.exit(0 if 'answer' in r else 1)" \
  "$DATA_DIR/train.parquet" || { echo "$DATA_DIR/train.parquet has no extra_info.answer (written by an older" \
  "gsm_symbolic.py): run examples/data_preprocess/gsm_symbolic.py again" >&2; exit 2; }

# bf16 compute where the CPU has it natively (fp32 master weights), else fp32 (emulated bf16 is many times slower)
if "$PY" -c "import sys; from verl.utils.device import cpu_has_native_bf16; sys.exit(0 if cpu_has_native_bf16() else 1)"; then
  DTYPE=bf16
else
  DTYPE=fp32
fi
echo "[run_smollm2_sft] steps=$STEPS precision=$DTYPE base=$BASE_MODEL data=$DATA_DIR out=$SFT_DIR"

"$PY" -m verl.trainer.fsdp_sft_trainer \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/test.parquet" \
  data.prompt_key=prompt \
  data.response_key=extra_info \
  data.response_dict_keys='[answer]' \
  data.max_length=384 \
  data.truncation=right \
  data.train_batch_size=16 \
  data.micro_batch_size_per_gpu=16 \
  model.partial_pretrain="$BASE_MODEL" \
  model.enable_gradient_checkpointing=false \
  model.fsdp_config.dtype=$DTYPE \
  optim.lr=2e-5 \
  optim.lr_warmup_steps_ratio=0.05 \
  trainer.total_training_steps="$STEPS" \
  trainer.test_freq=-1 \
  trainer.logger='[console]' \
  trainer.project_name=smollm2-gsm-symbolic \
  trainer.experiment_name=sft \
  trainer.default_local_dir="$SFT_DIR" "$@"
