#!/usr/bin/env bash
# On the GPU machine, in one go: the attention, decoder, model and graph tests; the
# Llama-3-8B decoder layer at T = 1, S = 1024 under `kiln run --check` (y and both caches
# against kernels/programs/decoder_reference.toml) with a decode loop of LOOP calls (S
# growing by one a call: host time a call, graphs captured and updated in place); then the
# whole model (kernels/programs/model_llama3_8b.toml: 32 layers, the final norm, the output
# projection) at T = 1, S = 1024 with a decode loop of MODEL_LOOP calls. The model has no
# double reference (its wiring is checked on the cpu by ModelTest; its layer above).
# Usage (GPU machine): bench/gpu/model_check.sh [build dir]    (results under $OUT)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-model-cache-XXXXXX)}
LOOP=${LOOP:-1000}
MODEL_LOOP=${MODEL_LOOP:-200}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
missing=$(ldd "$B/kiln" "$B/kiln-worker" "$B/tests/kiln_tests" | grep "not found" || true)
[ -n "$missing" ] && { echo "missing libraries: $missing"; exit 1; }
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== tests"
  timeout ${TEST_TIMEOUT:-200} "$B/tests/kiln_tests" \
    --gtest_filter="${TESTS:-Attention*:Decoder*:ModelTest.*:MultiTest.*:ProgramTest.Graph*:ProgramTest.AGraph*}" > "$OUTD/tests.log" 2>&1
  echo "exit code $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |NOTE|Failure" "$OUTD/tests.log" | head -30
fi
P=kernels/programs/decoder_llama3_8b.toml
echo "== kiln run --check --loop S=$LOOP $P T=1 S=1024"
timeout ${LAYER_TIMEOUT:-200} "$B/kiln" -q run --check --loop S=$LOOP "$P" --set T=1 --set S=1024 \
  --set CAP=$((1025 + LOOP)) > "$OUTD/layer.txt" 2>&1
echo "exit code $?"
tail -24 "$OUTD/layer.txt"
M=kernels/programs/model_llama3_8b.toml
echo "== kiln run --loop S=$MODEL_LOOP $M T=1 S=1024"
t0=$(date +%s.%N)
timeout ${MODEL_TIMEOUT:-240} "$B/kiln" -q run --loop S=$MODEL_LOOP --calls 50 "$M" --set T=1 \
  --set S=1024 --set CAP=$((1025 + MODEL_LOOP)) > "$OUTD/model.txt" 2>&1
echo "exit code $? after $(python3 -c "import sys; print('%.1f s' % (float(sys.argv[2]) - float(sys.argv[1])))" $t0 $(date +%s.%N))"
grep -vE "^ +[0-9]+ +[0-9.]+(us|ms) " "$OUTD/model.txt" | tail -20
