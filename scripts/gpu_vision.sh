#!/usr/bin/env bash
# Camera policy on push-v3 at a GPU's budget (the CPU runs stopped at 4,000 steps; see README "From pixels").
# Records 200 proprio episodes with the 128 px workspace camera (video), trains a FAST policy from pixels for
# STEPS steps (default 40,000 of 64, ten times the CPU budget's samples), evaluates 50 episodes, writes
# results/vision_gpu/{eval_info.json,rollouts.gif,train_metrics.jsonl}. Not yet run: this task had no GPU.
#   scripts/gpu_vision.sh [PRESET=tiny|small] [SIZE=128] [STEPS=40000]
# Fails with a clear message, and exit status 2, where no CUDA GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
VLA="$(dirname "$PYTHON")/vla"
PRESET="${PRESET:-tiny}"; SIZE="${SIZE:-128}"; STEPS="${STEPS:-40000}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ ! -x "$PYTHON" ]; then echo "gpu_vision.sh: $PYTHON not found; run 'make setup' first" >&2; exit 2; fi
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)" \
  || { echo "gpu_vision.sh: no CUDA GPU visible" >&2; exit 2; }
DATA=outputs/datasets/metaworld_push-v3_pixels$SIZE
RUN=outputs/train/vision_gpu_${PRESET}_$SIZE
OUT=results/vision_gpu
[ -d "$DATA" ] || "$VLA" data record --task push-v3 --episodes 200 --observation proprio --images \
  --camera observation.images.workspace --image-size "$SIZE" --root "$DATA" --quiet
"$VLA" train --config_path configs/images.yaml --dataset_root="$DATA" --output_dir="$RUN" --overwrite=true \
  --policy.preset="$PRESET" --policy.image_size="$SIZE" --policy.device=cuda --steps="$STEPS" --batch_size=64 \
  --policy.scheduler_decay_steps="$STEPS" --save_every=5000 --num_workers=4
"$VLA" eval --policy "$RUN/policy" --episodes 50 --num-envs 25 --gif 3 --out "$OUT"
cp "$RUN/metrics.jsonl" "$OUT/train_metrics.jsonl"
