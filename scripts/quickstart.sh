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
bash scripts/setup.sh
exec .venv/bin/python examples/quickstart/run_quickstart.py "$@"
