#!/usr/bin/env bash
# Cold compile of a spec's whole config space with 1 and with 2 compile
# threads (fresh cache each run), and a warm run (all hits) in a new process.
# Prints the median of RUNS runs of each (wall time of the whole process).
# Usage: bench/compile_cache.sh [SPEC] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-kernels/cpu/matmul.toml}
runs=${2:-3}
kiln=./build/kiln
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

time_one() {  # prints seconds of wall time for "$@"
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}' 
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

cold() {  # threads
  for i in $(seq "$runs"); do
    rm -rf "$tmp/cache"
    KILN_CACHE_DIR=$tmp/cache KILN_COMPILE_THREADS=$1 time_one $kiln -q compile "$spec"
  done | median
}
c1=$(cold 1)
c2=$(cold 2)
warm=$(for i in $(seq "$runs"); do KILN_CACHE_DIR=$tmp/cache time_one $kiln -q compile "$spec"; done | median)
n=$($kiln compile --json "$spec" 2>/dev/null | grep -c '"key"' || true)
printf '%s: %s configs, median of %s runs (whole process)\n' "$spec" "$n" "$runs"
printf '  %-28s %8.3fs\n' "cold, 1 compile thread" "$c1"
printf '  %-28s %8.3fs\n' "cold, 2 compile threads" "$c2"
printf '  %-28s %8.3fs\n' "warm, new process, all hits" "$warm"
awk -v c1="$c1" -v c2="$c2" -v w="$warm" 'BEGIN {
  printf "  cold 1 / cold 2 threads:  %.2fx\n", c1 / c2
  printf "  warm / cold (2 threads):  %.4f (%.0fx faster)\n", w / c2, c2 / w }' 
