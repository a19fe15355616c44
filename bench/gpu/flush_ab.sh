#!/usr/bin/env bash
# Does the way the L2 is flushed before each timed run change what the tuning chooses, and how
# fast the program then runs? The layer (kernels/programs/decoder_llama3_8b.toml) at T = 1,
# S = 1024 tuned from an empty cache with KILN_BENCH_L2_FLUSH=write (a memset: L2 left dirty)
# and with =read (a kernel reads the buffer: L2 left clean), ROUNDS times each in alternation,
# each process on its own fresh cache; whole calls back to back (call_ns) and every step's
# choice are printed. The layer is checked (--check) in the first round.
# Usage (GPU machine): bench/gpu/flush_ab.sh [build dir]   (ROUNDS, default 2; results: $OUT/flush_ab.tgz, $OUT/flush_ab.txt)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
R=$(mktemp -d /tmp/kiln-flush-ab-XXXXXX)
P=kernels/programs/decoder_llama3_8b.toml
for round in $(seq 1 "${ROUNDS:-2}"); do
  for mode in write read; do
    CHECK=; [ "$round" = 1 ] && CHECK=--check
    KILN_CACHE_DIR=$(mktemp -d /tmp/kiln-flush-cache-XXXXXX) KILN_BENCH_L2_FLUSH=$mode timeout 300 \
      "$B/kiln" -q run --json $CHECK "$P" --set T=1 --set S=1024 --set CAP=1025 > "$R/${mode}_$round.json" 2> "$R/${mode}_$round.err"
    python3 - "$R/${mode}_$round.json" "$mode" "$round" <<'PY' | tee -a "$OUTD/flush_ab.txt"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(f"flush {sys.argv[2]}, round {sys.argv[3]}: {d['call_ns'] / 1e3:.1f} us a call, check {d.get('check', {}).get('ok', '-')}")
    for s in d["steps"]:
        print(f"    {s['ns'] / 1e3:8.1f} us  {s['choice']}")
except Exception as e:
    print(f"flush {sys.argv[2]}, round {sys.argv[3]}: no figures ({e})")
PY
  done
done
tar czf "$OUTD/flush_ab.tgz" -C "$R" .
