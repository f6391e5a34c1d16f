#!/usr/bin/env bash
# README command 2: set up .venv (idempotent) and run the whole test suite (unit + end-to-end).
#   bash scripts/run_tests.sh                 # everything
#   bash scripts/run_tests.sh -m "not e2e"    # fast unit tests only (extra args go to pytest)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false WANDB_MODE=offline
exec .venv/bin/python -m pytest tests -q --durations=25 "$@"
