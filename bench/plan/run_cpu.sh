#!/usr/bin/env bash
# The cpu matmul plan: training on a log2 grid (M, N in 16..1024, K in
# 16..4096, 3 values each: 27 shapes), evaluated on bench/plan/cpu_eval.txt.
# Usage: bench/plan/run_cpu.sh [build folder] [extra kiln plan flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
shift || true
"$B/kiln" plan kernels/cpu/matmul.toml --grid M=16:1024:3 --grid N=16:1024:3 --grid K=16:4096:3 \
  --eval bench/plan/cpu_eval.txt "$@"
