#!/usr/bin/env bash
# Issue 26, the TMA family's clusters (MC = 2: B multicast to a pair of blocks) and stream-K
# (SK = 1: the last wave cut along K, parts summed through the workspace), on the GPU:
#   tests   every config of each member against a float64 reference at edge shapes
#           (CudaTest.TheTmaFamilyComputesItsProblemsAtEdgeShapes), with a time limit so that a
#           hang is reported, not waited for;
#   shapes  bench/gpu/tma_vs_cublas.sh for the TMA family alone: one `kiln tune --effort full`
#           a shape, cuBLASLt's ranked algorithms timed in the same tuning (each template's
#           result checked against the reference by the tuning), at SHAPES (a file of "M N K"
#           lines; default: tma_vs_cublas.sh's twelve), for at most SHAPE_SECONDS.
# Usage (GPU machine, with build-gpu-carry from scripts/gpu-carry.sh):
#   PARTS=tests,shapes bench/gpu/tma_sk_check.sh [build dir]
# Results under $OUT: tests.log, tma.tgz and tma_summary.txt.
set -uo pipefail
source "$(dirname "$0")/env.sh"
PARTS=${PARTS:-tests,shapes}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
"$B/kiln" backends 2>&1 | head -4
if [[ ,$PARTS, == *,tests,* ]]; then
  echo "== tests"
  timeout "${TEST_SECONDS:-300}" "$B/tests/kiln_tests" --gtest_brief=1 \
    --gtest_filter="${TESTS:-CudaTest.TheTmaFamily*}" > "$OUTD/tests.log" 2>&1
  echo "tests: exit $? (124: cut at the time limit)"
  grep -E "^\[  (PASSED|FAILED) |tests? ran|Failure|C\[" "$OUTD/tests.log" | head -40
fi
if [[ ,$PARTS, == *,shapes,* ]]; then
  echo "== shapes"
  FAMS=tma SECONDS_LEFT=${SHAPE_SECONDS:-300} bench/gpu/tma_vs_cublas.sh "$B" ${SHAPES:-}
fi
