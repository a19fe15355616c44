#!/usr/bin/env bash
# Does held timing (KILN_BENCH_HOLD=1: timed runs enqueued behind a held stream, docs/settings.md)
# quiet the timings the default flags noisy, and change what the tuning chooses? From empty
# caches, alternated, each process on its own cache: the decode GEMM at the output projection's
# shape (M = 1, N = 128256, K = 4096), whose tunings were flagged noisy (12-35%) in every kept
# run, with its noise and the noise warnings; then the layer (T = 1, S = 1024) on the same
# cache, its call time and choices. ROUNDS (default 1) rounds of both.
# Usage (GPU machine): bench/gpu/hold_ab.sh [build dir]   (results: $OUT/hold_ab.txt, $OUT/hold_ab.tgz)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
R=$(mktemp -d /tmp/kiln-hold-ab-XXXXXX)
for round in $(seq 1 "${ROUNDS:-1}"); do
  for hold in 0 1; do
    C=$(mktemp -d /tmp/kiln-hold-cache-XXXXXX)
    t=hold${hold}_$round
    KILN_CACHE_DIR=$C KILN_BENCH_HOLD=$hold timeout 240 "$B/kiln" -q tune --json kernels/cuda/gemm_decode.toml:bf16_nt \
      --set M=1 --set N=128256 --set K=4096 > "$R/lm_$t.json" 2> "$R/lm_$t.err"
    KILN_CACHE_DIR=$C KILN_BENCH_HOLD=$hold timeout 300 "$B/kiln" -q run --json kernels/programs/decoder_llama3_8b.toml \
      --set T=1 --set S=1024 --set CAP=1025 > "$R/layer_$t.json" 2> "$R/layer_$t.err"
    python3 - "$R" "$t" <<'PY' | tee -a "$OUTD/hold_ab.txt"
import json, sys
r, t = sys.argv[1:]
noisy = lambda f: sum("timings spread" in l for l in open(f, errors="replace"))
try:
    j = json.load(open(f"{r}/lm_{t}.json"))
    print(f"{t}: output projection's decode GEMM {j['best_ns'] / 1e3:.1f} us, noise {j['noise']:.3f}, "
          f"{noisy(f'{r}/lm_{t}.err')} noise warnings, chosen {j['best']}")
except Exception as e:
    print(f"{t}: output projection: no figures ({e})")
try:
    j = json.load(open(f"{r}/layer_{t}.json"))
    print(f"{t}: layer {j['call_ns'] / 1e3:.1f} us a call, {noisy(f'{r}/layer_{t}.err')} noise warnings")
    for s in j["steps"]:
        print(f"    {s['ns'] / 1e3:8.1f} us  {s['choice']}")
except Exception as e:
    print(f"{t}: layer: no figures ({e})")
PY
    rm -rf "$C"
  done
done
tar czf "$OUTD/hold_ab.tgz" -C "$R" . && rm -rf "$R"
