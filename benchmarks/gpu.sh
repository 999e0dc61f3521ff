#!/usr/bin/env bash
# The GPU mode of the benchmarks (under 5 minutes on one NVIDIA GPU):
#   benchmarks/gpu.sh            # writes benchmarks/results/cuda.json, updates BENCHMARKS.md
#   benchmarks/gpu.sh --quick    # fewer chunks per figure
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec python -m benchmarks.run --device cuda "$@"
