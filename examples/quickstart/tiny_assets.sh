# Sourced by examples/{sft,ppo_trainer,grpo_trainer}/run_tiny_*.sh: makes the embedded task data and the tiny
# model if they are missing and exports their paths. Override any of them from the environment.
#   DATA       RL parquet dir (train.parquet, test.parquet; sft/ holds the SFT pairs)   default ~/data/arithmetic
#   BASE_MODEL the untrained tiny Qwen2 directory                                         default ~/models/arith-tiny
#   SFT_DIR    where run_tiny_sft.sh writes checkpoints                                  default ~/checkpoints/arith-sft
#   MODEL      the policy the RL scripts start from: the latest SFT model if there is one, else BASE_MODEL
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" PYTHONUNBUFFERED=1
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}" VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}"
# OMP_WAIT_POLICY: left unset (OpenMP's spin-then-sleep default is fastest on an idle machine; PASSIVE helps only
# when the cores are shared with other busy jobs, and made idle-machine GRPO steps 2.3x slower)
export RAY_worker_niceness="${RAY_worker_niceness:-0}"   # Ray workers default to nice 15: starved next to other jobs
DATA="${DATA:-$HOME/data/arithmetic}"
BASE_MODEL="${BASE_MODEL:-$HOME/models/arith-tiny}"
SFT_DIR="${SFT_DIR:-$HOME/checkpoints/arith-sft}"
if [ ! -f "$DATA/sft/train.parquet" ]; then
  "$PY" "$ROOT/examples/data_preprocess/arithmetic.py" --local_dir "$DATA" --sft --max_digits 1 --test_size 200
fi
if [ ! -f "$BASE_MODEL/config.json" ]; then
  "$PY" -m verl.utils.embedded.make_model --size tiny --out "$BASE_MODEL"
fi
if [ -z "${MODEL:-}" ]; then
  MODEL="$BASE_MODEL"
  if [ -f "$SFT_DIR/latest_checkpointed_iteration.txt" ]; then
    MODEL="$SFT_DIR/global_step_$(cat "$SFT_DIR/latest_checkpointed_iteration.txt")/huggingface"
  else
    echo "note: no SFT model in $SFT_DIR (run examples/sft/run_tiny_sft.sh first); starting RL from the untrained $BASE_MODEL" >&2
  fi
fi
