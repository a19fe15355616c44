#!/usr/bin/env bash
# The whole model's decode step (T = 1) over caches of S = 128 .. 8192, or a prefill of T
# tokens (POINTS), kiln beside PyTorch (torch.compile with CUDA graphs, bench/gpu/
# torch_model.py; both compute the logits of every token), each timed as whole calls back to
# back between two CUDA events. kiln tunes in its first process (the first point); the others
# reuse the cache (the GEMMs' records by shape; attention is tuned a power of two of S).
# Usage (GPU machine): bench/gpu/model_sweep.sh [build dir]   (SWEEP="128 1024 4096 8192"; or
#   POINTS="T,S ...", any (T, S): a prefill of T tokens over S cached ones, as "1024,0");
#   RECORDS_IN=F: start from the tuning records of an earlier run (its $OUT/records.tgz);
#   TORCH=0: kiln's side alone.
#   Results: $OUT/model_summary.txt (bench/gpu/model_sweep_summary.py), $OUT/model_sweep.tgz
#   (each point's kiln run --json and stderr, torch_sweep.json), $OUT/records.tgz
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-sweep-cache}
R=$(mktemp -d /tmp/kiln-sweep-res-XXXXXX)  # each point's files; $OUTD gets them as one .tgz
records_in  # RECORDS_IN=F: records an earlier run wrote (bench/gpu/env.sh)
SWEEP=${SWEEP:-128 1024 4096 8192}
POINTS=${POINTS:-$(for s in $SWEEP; do printf '1,%s ' "$s"; done)}
DEADLINE=${DEADLINE:-560}
start=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - start))); }
reserve=$([ "${TORCH:-1}" = 1 ] && echo 120 || echo 10)  # seconds kept for PyTorch's side
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
M=kernels/programs/model_llama3_8b.toml
# a point's files: kiln_S<S> for a decode step (as before), kiln_T<T>_S<S> for T > 1
name() { if [ "$1" = 1 ]; then echo "kiln_S$2"; else echo "kiln_T$1_S$2"; fi; }
for p in $POINTS; do
  t=${p%,*}; s=${p#*,}
  [ "$(left)" -gt $((reserve + 30)) ] || { echo "-- out of time: kiln T=$t S=$s not run"; continue; }
  t0=$(date +%s)
  timeout $(($(left) - reserve)) "$B/kiln" -q run --json --calls 30 --reps 5 "$M" --set T=$t --set S=$s \
    --set CAP=$((s + t)) > "$R/$(name "$t" "$s").json" 2> "$R/$(name "$t" "$s").err"
  rc=$?
  python3 - "$R/$(name "$t" "$s").json" "T=$t S=$s" "$rc" "$(($(date +%s) - t0))" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(f"kiln {sys.argv[2]}: {d['call_ns'] / 1e6:.4f} ms a call back to back, host {d['host_ns_per_call'] / 1e3:.1f} us, "
          f"first call {d['first_call_s']:.2f} s, tuned {d['tuned_s']:.1f} s ({sys.argv[4]} s in all)")
except Exception as e:
    print(f"kiln {sys.argv[2]}: exit code {sys.argv[3]}, no figures ({e})")
PY
done
records_out  # $OUTD/records.tgz: what this run tuned, for RECORDS_IN on the next machine
points=$POINTS
if [ "${TORCH:-1}" = 1 ]; then
  TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/kiln-inductor-XXXXXX) timeout $(($(left) > 30 ? $(left) : 30)) \
    python3 bench/gpu/torch_model.py --out "$R/torch_sweep.json" --points $points --forms reduce-overhead \
    --calls 30 2> "$R/torch_stderr.txt"
  echo "torch exit code $?"
fi
python3 bench/gpu/model_sweep_summary.py "$R" | tee "$R/summary.txt" "$OUTD/model_summary.txt"
tar czf "$OUTD/model_sweep.tgz" -C "$R" .
