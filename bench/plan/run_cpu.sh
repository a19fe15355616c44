#!/usr/bin/env bash
# The cpu matmul plan: training on a log2 grid, evaluated on
# bench/plan/cpu_eval.txt (no evaluation shape is a training shape).
# Default grid: M, N in 16..1024 (4 values: 16, 64, 256, 1024), K in
# 16..4096 (5 values): 80 shapes. GRID="..." replaces it.
# Usage: bench/plan/run_cpu.sh [build folder] [extra kiln plan flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
shift || true
GRID=${GRID:---grid M=16:1024:4 --grid N=16:1024:4 --grid K=16:4096:5}
# shellcheck disable=SC2086
"$B/kiln" plan kernels/cpu/matmul.toml $GRID --eval bench/plan/cpu_eval.txt "$@"
