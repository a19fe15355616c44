#!/usr/bin/env bash
# Reads before the wait (a spec's early_reads; docs/program.md, "Reads before the wait"),
# on a GPU: the tests that show such a kernel (tests/fixtures/pdl/consume_stamp)
# overlaps only where nothing still running writes what it reads early, the PDL stale-read
# test, and the decode family's results at its edge shapes; then the layer and the whole
# model against the kernels before the change (OLD, as bench/gpu/ab_kernels.sh; the layer
# from this tree is checked with --check).
# Usage (GPU machine): OLD=ab-old bench/gpu/early_reads_check.sh [build dir]
#   (make ab-old with: mkdir -p ab-old && git archive <commit> kernels | tar -x -C ab-old)
#   Results: $OUT/tests.log, $OUT/ab.tgz, $OUT/ab_summary.txt, $OUT/records.tgz;
#   TESTS=0 skips the tests, AB=0 the A/B; RECORDS_IN=F starts from an earlier run's records.tgz
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-ab-cache}
records_in  # RECORDS_IN=records.tgz: what an earlier machine tuned (env.sh)
if [ "${TESTS:-1}" = 1 ]; then
  timeout ${TESTS_TIMEOUT:-200} "$B/tests/kiln_tests" \
    --gtest_filter='ProgramTest.AKernelThatReadsBeforeItsWait*:ProgramTest.AnOverlappedConsumer*:Spec.EarlyReads*:Spec.AnEarlyReadScope*:CudaTest.TheDecodeFamily*' \
    > "$OUTD/tests.log" 2>&1
  echo "tests: exit code $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|Failure|Expected|Which is|call [0-9]" "$OUTD/tests.log" | head -40
fi
if [ "${AB:-1}" = 1 ]; then
  POINTS=${POINTS:-1,1024} MODEL=${MODEL:-1} bash bench/gpu/ab_kernels.sh "${1:-build-gpu-carry}"
  cat "$OUTD/ab_summary.txt"
fi
records_out
