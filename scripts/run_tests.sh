#!/usr/bin/env bash
# README command 2: set up .venv (idempotent) and run the whole test suite (unit + end-to-end).
#   bash scripts/run_tests.sh                 # everything: the unit tests in two processes, then the end-to-end
#                                             # tests one at a time (each starts Ray workers on all cores)
#   bash scripts/run_tests.sh -m "not e2e"    # with arguments: one pytest run with them (e.g. the unit tests only)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false WANDB_MODE=offline
PYTEST=(.venv/bin/python -m pytest tests -q --durations=25)
if [ "$#" -gt 0 ]; then
  exec "${PYTEST[@]}" "$@"
fi
status=0
"${PYTEST[@]}" -m "not e2e" -n 2 || status=$?
"${PYTEST[@]}" -m e2e || status=$?
exit "$status"
