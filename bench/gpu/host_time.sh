#!/usr/bin/env bash
# The host time of a decode step (issue 27's target: <= 5 us a call with graphs on, no capture
# within a bucket of S): the decoder layer (kernels/programs/decoder_llama3_8b.toml) at T = 1
# from S = 1024 over a decode loop of 1000 calls, checked against its reference, then the whole
# model (model_llama3_8b.toml) from S = 1024 over 200 calls, both through `kiln run --json
# --loop` (the loop's second pass is timed: host time a call, of it the time spent setting the
# graphs to each call's S in place, and the device's time a call). First, the GPU tests of
# graphs updated in a decode loop (TESTS=none: none). One cache for all (the model reuses the
# layer's records): a run on a cache an earlier run filled measures warm processes. ALSO="dir
# ..." runs the same after it with other builds (an earlier commit's kiln and kiln-worker), then
# this build again, each in its own process, on the same cache. Each run is followed by the same
# run with KILN_PROGRAM_CELLS=off (graphs set in place launch by launch, not through a cell), in a
# process of its own on the cache the first left. LAYER=0 or MODEL=0 leaves that part out.
# Usage (GPU machine): bench/gpu/host_time.sh [build dir]   (results under $OUT)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-host-time-cache}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUTD/host_time.txt"
if [ "${TESTS:-}" != none ]; then
echo "== tests" | tee -a "$OUTD/host_time.txt"
timeout "${TEST_TIMEOUT:-200}" "$B/tests/kiln_tests" \
  --gtest_filter="${TESTS:-DecoderTest.*:ProgramTest.*Gpu*:ProgramTest.AGraph*:ProgramTest.AnOverlapped*:AttentionTest.*Gpu*:ModelTest.*}" \
  > "$OUTD/host_time_tests.log" 2>&1
echo "exit code $?" | tee -a "$OUTD/host_time.txt"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|NOTE" "$OUTD/host_time_tests.log" | tee -a "$OUTD/host_time.txt"
fi
summary() {  # summary FILE
  python3 - "$1" <<'PY' | tee -a "$OUTD/host_time.txt"
import json, sys
d = json.load(open(sys.argv[1]))
l = d["loop"]
c = d.get("check", {}).get("ok", "-")
print(f"  back to back at one S: {d['call_ns'] / 1e3:.1f} us a call on the device, {d['host_ns_per_call'] / 1e3:.2f} us of host time")
print(f"  decode loop of {l['calls']} calls from S = {l['from']}: {l['host_ns_per_call'] / 1e3:.2f} us of host time a call, "
      f"{l.get('graph_update_ns_per_call', 0) / 1e3:.2f} us of it setting graphs in place; {l['call_ns'] / 1e3:.1f} us a call "
      f"on the device; graphs captured {l['graph_captures']}, updated {l['graph_updates']}, replayed {l['graph_replays']}, "
      f"calls sized for their bucket (cells) {l.get('cell_calls', '-')}; check {c}")
PY
}
n=0
for K in $B ${ALSO:+$ALSO $B}; do
  n=$((n + 1))
  for cells in graphs off; do
    sfx=$([ $cells = off ] && echo _off || true)
    if [ "${LAYER:-1}" != 0 ]; then
      echo "== $K: decoder layer, T = 1, S = 1024, KILN_PROGRAM_CELLS=$cells" | tee -a "$OUTD/host_time.txt"
      t0=$(date +%s)
      KILN_PROGRAM_CELLS=$cells timeout "${LAYER_TIMEOUT:-300}" "$K/kiln" -q run --json --check --loop S=1000 \
        kernels/programs/decoder_llama3_8b.toml --set T=1 --set S=1024 --set CAP=2025 \
        > "$OUTD/layer$n$sfx.json" 2> "$OUTD/layer$n$sfx.err"
      echo "exit code $? after $(($(date +%s) - t0)) s" | tee -a "$OUTD/host_time.txt"
      summary "$OUTD/layer$n$sfx.json"
    fi
    if [ "${MODEL:-1}" != 0 ]; then
      echo "== $K: whole model, T = 1, S = 1024, KILN_PROGRAM_CELLS=$cells" | tee -a "$OUTD/host_time.txt"
      t0=$(date +%s)
      KILN_PROGRAM_CELLS=$cells timeout "${MODEL_TIMEOUT:-300}" "$K/kiln" -q run --json --loop S=200 --calls 50 \
        kernels/programs/model_llama3_8b.toml --set T=1 --set S=1024 --set CAP=1225 \
        > "$OUTD/model$n$sfx.json" 2> "$OUTD/model$n$sfx.err"
      echo "exit code $? after $(($(date +%s) - t0)) s" | tee -a "$OUTD/host_time.txt"
      summary "$OUTD/model$n$sfx.json"
    fi
  done
done
