#!/usr/bin/env bash
# Cold vs warm `kiln tune` of a spec at one shape, then N repeated cold
# tunings (each with an empty cache): which config each picks, and how far
# apart the best two configs were.
# Usage: bench/tune_repeat.sh [SPEC] [N] [--set ...]
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-kernels/cpu/matmul.toml}
n=${2:-5}
shift $(( $# >= 2 ? 2 : $# ))
sets=("$@")
[ ${#sets[@]} -eq 0 ] && sets=(--set M=256 --set N=256 --set K=256)
kiln=./build/kiln
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

now() { date +%s.%N; }
t0=$(now); KILN_CACHE_DIR=$tmp/c0 $kiln -q tune "$spec" "${sets[@]}" >/dev/null; t1=$(now)
KILN_CACHE_DIR=$tmp/c0 $kiln -q tune "$spec" "${sets[@]}" >/dev/null; t2=$(now)
awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN {
  printf "kiln tune, whole process: cold %.3fs, warm (answered from the cache) %.3fs, cold/warm %.0fx\n\n", b - a, c - b, (b - a) / (c - b) }'

printf '%-4s %-22s %10s  %-22s %10s %8s\n' run best "best" "second" "second" "gap"
for i in $(seq "$n"); do
  KILN_CACHE_DIR=$tmp/c$i $kiln -q tune --json "$spec" "${sets[@]}" > "$tmp/r$i.json"
  python3 - "$tmp/r$i.json" "$i" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ok = sorted([c for c in r["configs"] if c["ns"] is not None], key=lambda c: c["ns"])
name = lambda c: " ".join(f"{k}={v}" for k, v in c["params"].items())
b, s = ok[0], ok[1]
print(f'{sys.argv[2]:<4} {name(b):<22} {b["ns"]/1e3:9.1f}us  {name(s):<22} {s["ns"]/1e3:9.1f}us {100*(s["ns"]/b["ns"]-1):7.1f}%')
PY
done
