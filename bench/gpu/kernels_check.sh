#!/usr/bin/env bash
# Correctness of the GEMM families on the GPU after a change to their source
# (kernels/cuda/gemm*.cu, gemm_common.cuh, gemm_epilogue.cuh): every runnable
# config of a shape is compiled and checked against the reference by
# `kiln tune --effort full` (a config that computes something else is a
# failure of kind "wrong"), at shapes where split K (thread-block clusters)
# can run; then the GPU tests. Prints one line per tuning: configs ok, and
# the failures by kind. Usage (GPU machine, with build-gpu-carry from
# scripts/gpu-carry.sh): bench/gpu/kernels_check.sh [build dir]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=$(mktemp -d /tmp/kiln-kc-XXXXXX)
trap 'rm -rf "$KILN_CACHE_DIR"' EXIT
check() {  # spec, --set values...
  local spec=$1; shift
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  timeout 150 "$B/kiln" -q tune "kernels/cuda/$spec" "${sets[@]}" --effort full --no-library --json >"$KILN_CACHE_DIR/out.json" 2>"$KILN_CACHE_DIR/err.txt"
  local rc=$?
  python3 bench/gpu/tune_summary.py "$spec" "$*" "$rc" "$KILN_CACHE_DIR/out.json" "$KILN_CACHE_DIR/err.txt"
}
check gemm.toml:bf16_nt_gated M=64 N=2048 K=8192
check gemm_wgmma.toml:bf16_nt_residual M=256 N=1024 K=8192
check gemm_decode.toml:bf16_nt_gated M=3 N=4096 K=4096
check gemm_decode.toml:bf16_nt_residual M=12 N=1000 K=2048
"$B/tests/kiln_tests" --gtest_filter='Cuda*:Program*:FirstCall*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran"
