#!/usr/bin/env bash
# The quickstart (README command 1): set up .venv, then run the embedded CPU pipeline
#   data -> tiny model -> SFT warm start -> GRPO (vLLM rollout, or HF when vLLM is unavailable) -> report.
# Everything is written under quickstart_out/ (git-ignored). Extra arguments go to run_quickstart.py, e.g.
#   bash scripts/quickstart.sh --rollout hf      # force the HF rollout
#   bash scripts/quickstart.sh --fast            # a one-minute smoke run (too short to learn anything)
# See docs/quickstart.md for what each stage does and the output to expect.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# setup.sh installs quietly (minutes on a fresh clone): say every 10 s that it is still at work.
bash scripts/setup.sh &
SETUP_PID=$!
START=$SECONDS
NEXT=10
while kill -0 "$SETUP_PID" 2>/dev/null; do
  sleep 1
  if (( SECONDS - START >= NEXT )) && kill -0 "$SETUP_PID" 2>/dev/null; then
    echo "[quickstart $(date +%H:%M:%S)] setup: installing into .venv, $((SECONDS - START)) s so far"
    NEXT=$((NEXT + 10))
  fi
done
wait "$SETUP_PID"
exec .venv/bin/python examples/quickstart/run_quickstart.py "$@"
