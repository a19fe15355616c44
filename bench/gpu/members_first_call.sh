#!/usr/bin/env bash
# The first call of cuda GEMM family members through a Kernel handle, on the GPU:
# kiln_bench_first_call makes a Kernel on the member (the path an application takes),
# cold (empty cache, the shape tuned behind a safe choice until the tuned one is in
# use: --wait-tuned), then warm twice in fresh processes (record and binary cached).
# Usage (GPU machine, with build-gpu-carry from scripts/gpu-carry.sh):
#   bench/gpu/members_first_call.sh [build dir]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
work=$(mktemp -d /tmp/kiln-mfc-XXXXXX)
trap 'rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
while read -r spec M N K; do
  [ -z "$spec" ] && continue
  c=$work/$(echo "$spec" | tr ':/' '__')
  echo "== $spec M=$M N=$N K=$K"
  KILN_CACHE_DIR=$c timeout 300 "$B/bench/kiln_bench_first_call" "$spec" --wait-tuned --set M=$M --set N=$N --set K=$K 2>&1 | tail -3
  echo "exit code $?"
  for i in 1 2; do
    KILN_CACHE_DIR=$c timeout 120 "$B/bench/kiln_bench_first_call" "$spec" --set M=$M --set N=$N --set K=$K 2>&1 | tail -2
  done
done <<'ROWS'
kernels/cuda/gemm.toml:bf16_nt 300 14336 4096
kernels/cuda/gemm.toml:bf16_nt_bias_gelu 77 1000 520
kernels/cuda/gemm_wgmma.toml:bf16_nt_residual 1024 4096 14336
kernels/cuda/gemm_decode.toml:bf16_nt_gated 4 14336 4096
ROWS
