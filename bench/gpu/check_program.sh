#!/usr/bin/env bash
# On the GPU machine, in one go: the GPU tests twice in a row in one run
# (with the spec tests, which read the kernels from wherever the build is;
# the two NVRTC compile-only tests once, after them),
# then `kiln run --check` of the Llama-3-8B MLP block at several token
# counts (each result checked against kernels/programs/mlp_reference.toml:
# plain f64 kernels on the cpu, on at most 64 sampled rows), then the same
# block with the gate and up weights of its fused step swapped, the
# reference untouched, which the check must fail (exit code 3).
# Usage (GPU machine, after scripts/build-gpu.sh and scripts/gpu-carry.sh here):
#   bench/gpu/check_program.sh [build dir] [tokens]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
TOKENS=${2:-1,64,777,2048}
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=$(mktemp -d /tmp/kiln-check-cache-XXXXXX)
P=kernels/programs/mlp_llama3_8b.toml

echo "== the machine"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
missing=$(ldd "$B/kiln" "$B/kiln-worker" "$B/tests/kiln_tests" | grep "not found" || true)
[ -n "$missing" ] && { echo "missing libraries: $missing"; exit 1; }

# The two NVRTC compile-only tests take about 220 s together (CI runs them
# without a GPU too): once; the tests that launch on the GPU: twice in a row.
SLOW='CudaTest.NvrtcCompilesEveryBuiltInConfigForTheH100:CudaTest.CubinMetadataAgreesWithPtxasReport'
echo "== the GPU tests, twice in a row"
timeout ${TEST_TIMEOUT:-300} "$B/tests/kiln_tests" --gtest_repeat=2 \
  --gtest_filter="Cuda*:ProgramTest.GraphReplay*:Library*:Spec.*:-$SLOW" > "$OUTD/gpu_tests.log" 2>&1
echo "exit code $?"
grep -E "^\[  (PASSED|FAILED)  \]|tests? ran|^\[  SKIPPED \]" "$OUTD/gpu_tests.log" | sort | uniq -c
echo "== the NVRTC compile-only tests, once"
timeout ${SLOW_TIMEOUT:-400} "$B/tests/kiln_tests" --gtest_filter="$SLOW" > "$OUTD/gpu_compile_tests.log" 2>&1
echo "exit code $?"
grep -E "^\[  (PASSED|FAILED)  \]" "$OUTD/gpu_compile_tests.log"

echo "== kiln run --check, T = $TOKENS"
for t in ${TOKENS//,/ }; do
  timeout ${RUN_TIMEOUT:-240} "$B/kiln" -q run "$P" --set T=$t --check --calls 20 --reps 5 > "$OUTD/check_$t.txt" 2>&1
  rc=$?
  echo "T=$t: exit code $rc"
  grep -E "^program|check|  y \(|^steps" "$OUTD/check_$t.txt"
done

echo "== the same block with w_gate and w_up swapped in its fused step (the reference untouched)"
S=kernels/programs/mlp_llama3_8b_swapped.toml
sed 's|args   = \["n", "w_gate", "w_up", "h", "T", "I", "H"\]|args   = ["n", "w_up", "w_gate", "h", "T", "I", "H"]|' "$P" > "$S"
grep -q '"w_up", "w_gate"' "$S" || { echo "the swap did not apply"; exit 1; }
timeout ${RUN_TIMEOUT:-240} "$B/kiln" -q run "$S" --set T=64 --check --calls 5 --reps 3 > "$OUTD/check_swapped.txt" 2>&1
echo "swapped, T=64: exit code $? (3: the check failed, as it must)"
grep -E "check|  y \(" "$OUTD/check_swapped.txt"
rm -f "$S"
