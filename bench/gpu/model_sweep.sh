#!/usr/bin/env bash
# The whole model's decode step (T = 1) over caches of S = 128 .. 8192, kiln beside PyTorch
# (torch.compile with CUDA graphs, bench/gpu/torch_model.py), each timed as whole calls back
# to back between two CUDA events. kiln tunes in its first process (S = the first point);
# the others reuse the cache (the GEMMs' records; attention is tuned a power of two of S).
# Usage (GPU machine): bench/gpu/model_sweep.sh [build dir]   (SWEEP="128 1024 4096 8192")
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-sweep-cache}
SWEEP=${SWEEP:-128 1024 4096 8192}
DEADLINE=${DEADLINE:-560}
start=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - start))); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
M=kernels/programs/model_llama3_8b.toml
for s in $SWEEP; do
  [ "$(left)" -gt 150 ] || { echo "-- out of time: kiln S=$s not run"; continue; }
  t0=$(date +%s)
  timeout $(($(left) - 120)) "$B/kiln" -q run --json --calls 30 --reps 5 "$M" --set T=1 --set S=$s \
    --set CAP=$((s + 1)) > "$OUTD/kiln_S$s.json" 2> "$OUTD/kiln_S$s.err"
  rc=$?
  python3 - "$OUTD/kiln_S$s.json" "$s" "$rc" "$(($(date +%s) - t0))" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(f"kiln S={sys.argv[2]}: {d['call_ns'] / 1e6:.4f} ms a call back to back, host {d['host_ns_per_call'] / 1e3:.1f} us, "
          f"first call {d['first_call_s']:.2f} s, tuned {d['tuned_s']:.1f} s ({sys.argv[4]} s in all)")
except Exception as e:
    print(f"kiln S={sys.argv[2]}: exit code {sys.argv[3]}, no figures ({e})")
PY
done
points=""
for s in $SWEEP; do points="$points 1,$s"; done
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/kiln-inductor-XXXXXX) timeout $(($(left) > 30 ? $(left) : 30)) \
  python3 bench/gpu/torch_model.py --out "$OUTD/torch_sweep.json" --points $points --forms reduce-overhead \
  --calls 30 2> "$OUTD/torch_stderr.txt"
echo "torch exit code $?"
