#!/usr/bin/env bash
# Every member of the cuda GEMM families (docs/families.md) on the GPU: tuned
# at one shape its family runs (`kiln tune`, default effort, no library
# choices), every timed config checked against the reference (a config that
# computes something else is a failure of kind "wrong"). One line per member:
# configs by kind and the choice. Then the GPU tests, the two NVRTC
# compile-only ones left out (CI runs those with no GPU).
# Usage (GPU machine, with build-gpu-carry from scripts/gpu-carry.sh):
#   bench/gpu/families_check.sh [build dir]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=$(mktemp -d /tmp/kiln-fc-XXXXXX)
trap 'rm -rf "$KILN_CACHE_DIR"' EXIT
members() {  # the members a family file lists
  python3 -c 'import re,sys; t=open(sys.argv[1]).read(); m=re.search(r"^members\s*=\s*\[(.*?)\]", t, re.S|re.M); print(" ".join(re.findall(r"\"([a-z0-9_]+)\"", m.group(1))))' "$1"
}
check() {  # family file, M, N, K
  local f=$1 M=$2 N=$3 K=$4
  for m in $(members "kernels/cuda/$f"); do
    timeout 200 "$B/kiln" -q tune "kernels/cuda/$f:$m" --set M=$M --set N=$N --set K=$K --no-library --json \
      >"$KILN_CACHE_DIR/out.json" 2>"$KILN_CACHE_DIR/err.txt"
    rc=$?
    python3 bench/gpu/tune_summary.py "$f:$m" "M=$M N=$N K=$K" "$rc" "$KILN_CACHE_DIR/out.json" "$KILN_CACHE_DIR/err.txt"
  done
}
echo "== the machine"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== every member"
check gemm.toml 200 1000 520
check gemm_wgmma.toml 256 1024 1024
check gemm_decode.toml 7 1000 2048
echo "== the GPU tests (less the two NVRTC compile-only ones)"
timeout 300 "$B/tests/kiln_tests" \
  --gtest_filter='Cuda*:Program*:FirstCall*:Family*:-CudaTest.NvrtcCompilesEveryBuiltInConfigForTheH100:CudaTest.CubinMetadataAgreesWithPtxasReport' \
  2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran"
