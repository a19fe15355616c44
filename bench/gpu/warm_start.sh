#!/usr/bin/env bash
# The whole model's start (issue 28, item 3): the time from exec to the first token of a
# PROMPT-token prompt (128) in a fresh process running kernels/programs/model_llama3_8b.toml
# (bench/model_logits.cpp: the weights made on the device by kiln::InputFiller, then the
# prompt's call; it prints when each stage was done), beside the floor measured in the same
# run: a process that only makes a CUDA context (bench/context.cpp). Parts (PARTS, default
# cold,pack,warm):
#   cold: an empty KILN_CACHE_DIR, KILN_FIRST_CALL=swap (the default): safe choices at once;
#   pack: `kiln pack` of the prompt's shape (it tunes every step) into $OUT/model_T<P>.kiln,
#         its cache kept as the warm cache (ARTIFACT=file skips it and uses that artifact);
#   warm: ROUNDS (3) rounds of the floor, then kiln from the artifact with an empty cache, from the
#         artifact with the cache its runs left (the fill kernel's binary; again with
#         KILN_CUDA_WARM_LIBRARIES=0: cuBLASLt opened by the first call), and from the warm
#         cache alone (KILN_BACKGROUND_COMPILE=1, the default, and =0) where it holds records.
# With KILN_LOG=debug, warm_start.log says what each step's first call took; DEBUG=1 adds one
# run from the artifact and its cache with KILN_LOG=debug, into first_call_debug.txt.
# Every time is from exec (BENCH_EXEC_NS, taken just before it) to the result, synchronised.
# Usage (GPU machine): bench/gpu/warm_start.sh [build dir]   (results under $OUT)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
M=${MODEL:-kernels/programs/model_llama3_8b.toml}
P=${PROMPT:-128}
PARTS=${PARTS:-cold,pack,warm}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
CACHE=${WARM_CACHE:-/tmp/kiln-warm-cache}
A=${ARTIFACT:-$OUTD/model_T$P.kiln}
W=/tmp/kiln-warm-logits
log() { echo "$*" | tee -a "$OUTD/warm_start.txt"; }
ctx() {
  log "floor: $(env BENCH_EXEC_NS=$(date +%s%N) timeout 60 "$B/bench/kiln_bench_context" 2>&1)"
}
first() {  # first LABEL [VAR=VALUE ...]
  local label=$1
  shift
  local out
  out=$(env "$@" BENCH_EXEC_NS=$(date +%s%N) timeout "${FIRST_TIMEOUT:-120}" "$B/bench/kiln_bench_model_logits" "$M" \
    --out "$W" --prompt "$P" --steps 0 2>&1)
  local rc=$?
  log "$label: $(echo "$out" | grep -E "^first token|kiln_bench_model_logits:" | head -2) (exit code $rc)"
  log "    $(echo "$out" | grep -E "^stages" | head -1)"
  echo "$out" >> "$OUTD/warm_start.log"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUTD/warm_start.txt"
if has cold; then
  rm -rf /tmp/kiln-cold-cache
  ctx
  first "kiln cold, empty cache, KILN_FIRST_CALL=swap" KILN_CACHE_DIR=/tmp/kiln-cold-cache KILN_FIRST_CALL=swap
fi
if has pack && [ -z "${ARTIFACT:-}" ]; then
  t0=$(date +%s)
  KILN_CACHE_DIR=$CACHE timeout "${PACK_TIMEOUT:-420}" "$B/kiln" -q pack "$M" --set T="$P" --set S=0 --set CAP="$P" \
    -o "$A" > "$OUTD/pack.txt" 2>&1
  log "kiln pack T=$P: exit code $? after $(($(date +%s) - t0)) s; $(tail -1 "$OUTD/pack.txt")"
  ls -la "$A" | tee -a "$OUTD/warm_start.txt"
fi
if has warm; then
  # The warm cache holds the model's records where this run packed it (or WARM_CACHE named
  # one); with a given artifact and no pack, the cache is only what the artifact's runs left.
  cache_only=0
  if { has pack && [ -z "${ARTIFACT:-}" ]; } || [ -n "${WARM_CACHE:-}" ]; then cache_only=1; fi
  rm -rf /tmp/kiln-artifact-cache
  for i in $(seq "${ROUNDS:-3}"); do
    ctx
    rm -rf /tmp/kiln-empty-cache
    first "kiln warm, artifact, empty cache" KILN_ARTIFACT="$A" KILN_CACHE_DIR=/tmp/kiln-empty-cache
    first "kiln warm, artifact and the cache it left" KILN_ARTIFACT="$A" KILN_CACHE_DIR=/tmp/kiln-artifact-cache
    first "kiln warm, artifact and the cache it left, KILN_CUDA_WARM_LIBRARIES=0" KILN_ARTIFACT="$A" \
      KILN_CACHE_DIR=/tmp/kiln-artifact-cache KILN_CUDA_WARM_LIBRARIES=0
    if [ $cache_only = 1 ]; then
      for bc in 1 0; do
        first "kiln warm, cache only, KILN_BACKGROUND_COMPILE=$bc" KILN_CACHE_DIR="$CACHE" KILN_BACKGROUND_COMPILE=$bc
      done
    fi
  done
  if [ "${DEBUG:-0}" = 1 ]; then
    # One more, from the artifact and its cache, with kiln's debug lines: what each step's first call took.
    env KILN_ARTIFACT="$A" KILN_CACHE_DIR=/tmp/kiln-artifact-cache KILN_LOG=debug BENCH_EXEC_NS=$(date +%s%N) \
      timeout "${FIRST_TIMEOUT:-120}" "$B/bench/kiln_bench_model_logits" "$M" --out "$W" --prompt "$P" --steps 0 \
      > "$OUTD/first_call_debug.txt" 2>&1
  fi
fi
