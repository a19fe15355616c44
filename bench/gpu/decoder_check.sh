#!/usr/bin/env bash
# On the GPU machine, in one go (issue 27): the attention, decoder and graph tests, then
# the Llama-3-8B decoder layer at T = 1, S = 1024 under `kiln run --check` (y and both
# caches against kernels/programs/decoder_reference.toml) with a decode loop of LOOP calls
# (S growing by one a call; host time a call, graphs captured and updated), then a prompt
# over a cache checked the same way.
# Usage (GPU machine): bench/gpu/decoder_check.sh [build dir]    (results under $OUT)
#   FILTER: the tests run (a gtest filter; default the attention, decoder and graph tests);
#   POINTS: the (T, S) pairs checked (default "1,1024 128,300"); LOOP: the decode loop's calls
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-dec-cache-XXXXXX)}
LOOP=${LOOP:-1000}
P=kernels/programs/decoder_llama3_8b.toml
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
missing=$(ldd "$B/kiln" "$B/kiln-worker" "$B/tests/kiln_tests" | grep "not found" || true)
[ -n "$missing" ] && { echo "missing libraries: $missing"; exit 1; }
python3 bench/gpu/copy_bandwidth.py | tee "$OUTD/copy_bandwidth.txt"  # a decode step's bytes are set against it
echo "== tests"
timeout ${TEST_TIMEOUT:-240} "$B/tests/kiln_tests" --gtest_filter="${FILTER:-Attention*:Decoder*:ProgramTest.Graph*:ProgramTest.AGraph*}" \
  > "$OUTD/tests.log" 2>&1
echo "exit code $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |NOTE|Failure" "$OUTD/tests.log" | head -30
for pt in ${POINTS:-"1,1024 128,300"}; do
  t=${pt%,*}; s=${pt#*,}
  LOOPARG=
  [ "$t" = 1 ] && LOOPARG="--loop S=$LOOP"
  echo "== kiln run --check $P T=$t S=$s $LOOPARG"
  timeout ${POINT_TIMEOUT:-240} "$B/kiln" -q run --check $LOOPARG "$P" --set T=$t --set S=$s \
    --set CAP=$((s + t + LOOP)) > "$OUTD/run_${t}_${s}.txt" 2>&1
  echo "exit code $?"
  cat "$OUTD/run_${t}_${s}.txt" | tail -22
done
