#!/usr/bin/env bash
# The whole model's result check (issue 28): kiln runs kernels/programs/model_llama3_8b.toml
# (bench/model_logits.cpp) over a prompt of PROMPT (128) tokens, CHUNK (0: none) more over
# that cache, then STEPS (16) decode steps, tuned on each shape's first call unless KILN_CACHE_DIR
# holds the records; bench/gpu/torch_logits.py makes the same weights from the seeds and
# compares kiln's logits at every call with PyTorch's in float32 (bound 3e-2 a row).
# PART=kiln or PART=torch runs one side (the logits wait under $LOGITS between the two).
# KILN_FIRST_CALL=wait by default: each call runs what tuning chose, as the timed runs do.
# Usage (GPU machine): bench/gpu/model_logits.sh [build dir]   (results under $OUT)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
LOGITS=${LOGITS:-/tmp/kiln-logits}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-json-cache}
records_in  # RECORDS_IN=records.tgz: what an earlier machine tuned (env.sh)
# Every step tuned before its first call returns: the calls run (and check) the tuned choices.
export KILN_FIRST_CALL=${KILN_FIRST_CALL:-wait}
PART=${PART:-kiln,torch}
if [[ ,$PART, == *,kiln,* ]]; then
  echo "== kiln: prompt ${PROMPT:-128}, chunk ${CHUNK:-0}, then ${STEPS:-16} decode steps"
  t0=$(date +%s)
  "$B/bench/kiln_bench_model_logits" kernels/programs/model_llama3_8b.toml --out "$LOGITS" \
    --prompt "${PROMPT:-128}" --chunk "${CHUNK:-0}" --steps "${STEPS:-16}" 2> "$OUTD/model_logits.err"
  rc=$?
  echo "exit code $rc after $(($(date +%s) - t0)) s"
  grep -E "^call|filled|model_logits" "$OUTD/model_logits.err" | head -30
  cp "$LOGITS/meta.json" "$OUTD/logits_meta.json" 2>/dev/null
  if [ $rc -ne 0 ]; then echo "kiln failed: nothing to compare"; exit $rc; fi
fi
if [[ ,$PART, == *,torch,* ]]; then
  echo "== PyTorch float32 (and bf16) on the same weights"
  python3 bench/gpu/torch_logits.py "$LOGITS" --out "$OUTD/logits_check.json"
  echo "exit code $?"
fi
