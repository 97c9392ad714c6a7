#!/usr/bin/env bash
# The GPU check (under 5 minutes on one CUDA GPU): bf16 training samples/s and MFU of the small policy and the
# PaliGemma 3B shape (random weights), and decode latency of tiny/small; writes results/gpu_check.json.
#   scripts/gpu_check.sh [--peak-tflops 989] [--out results/gpu_check.json] ...   (see scripts/gpu_check.py --help)
# Fails with a clear message, and exit status 2, where no CUDA GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PYTHON" ]; then
  echo "gpu_check.sh: $PYTHON not found; run 'make setup' first (or set PYTHON=/path/to/python)" >&2
  exit 2
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout "${GPU_CHECK_TIMEOUT:-300}" "$PYTHON" scripts/gpu_check.py "$@"
