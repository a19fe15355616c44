#!/usr/bin/env bash
# Cold vs warm `kiln tune` of a spec at one shape, then N repeated cold
# tunings (each with an empty cache): which config each chooses, the noise
# it measured, and whether the runs agree. Runs agree when they choose one
# config, or when every config any run chose is, in each run's own timings,
# within that run's tie window (min(noise, 3%)) of its fastest.
# Usage: bench/tune_repeat.sh [SPEC] [N] [--set ...]
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-kernels/cpu/matmul.toml}
n=${2:-10}
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

for i in $(seq "$n"); do
  KILN_CACHE_DIR=$tmp/c$i $kiln -q tune --json "$spec" "${sets[@]}" > "$tmp/r$i.json"
done
python3 - "$tmp" "$n" <<'PY'
import json, sys
tmp, n = sys.argv[1], int(sys.argv[2])
runs = [json.load(open(f"{tmp}/r{i}.json")) for i in range(1, n + 1)]
name = lambda p: " ".join(f"{k}={v}" for k, v in p.items())
print(f"{'run':<4} {'chose':<22} {'time':>9} {'fastest':<22} {'chose/fastest':>13} {'noise':>7}")
chosen = set()
for i, r in enumerate(runs, 1):
    ok = sorted([c for c in r["configs"] if c["ns"] is not None], key=lambda c: c["ns"])
    c = next(c for c in ok if c["params"] == r["best"])
    chosen.add(name(r["best"]))
    print(f"{i:<4} {name(r['best']):<22} {c['ns']/1e3:8.1f}us {name(ok[0]['params']):<22} "
          f"{c['ns']/ok[0]['ns']:12.3f}x {100*r['noise']:6.1f}%")
# Within each run: how far apart the configs any run chose are, in that run's
# own timings, against the noise that run measured.
print(f"\n{len(chosen)} distinct choice(s) in {n} cold tunings: {', '.join(sorted(chosen))}")
within = 0
for i, r in enumerate(runs, 1):
    ok = {name(c["params"]): c["ns"] for c in r["configs"] if c["ns"] is not None}
    t = [ok[p] for p in chosen if p in ok]
    spread = max(t) / min(t) - 1
    within += spread <= r["noise"]
    if len(chosen) > 1:
        print(f"  run {i}: the chosen configs are {100*spread:.1f}% apart; its measured noise {100*r['noise']:.1f}%")
print(f"runs in which every config chosen by any run lies within that run's measured noise: {within} of {n}")
PY
