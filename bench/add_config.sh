#!/usr/bin/env bash
# What adding configs to a tuned spec costs: tunes the built-in cpu matmul
# at one shape (cold), then the same spec with one more value of BK (9 more
# configs), and, for comparison, the larger spec cold. Prints configs timed,
# configs re-timed side by side, and seconds for each.
# Usage: bench/add_config.sh [M=N=K, default 256]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-256}
kiln=$PWD/build/kiln
work=$(mktemp -d /tmp/kiln-add-XXXXXX)
trap 'rm -rf "$work"' EXIT
cp kernels/cpu/matmul.toml kernels/cpu/matmul.cpp "$work/"
sed -e 's/^BK = \[128, 512\]/BK = [128, 512, 256]/' kernels/cpu/matmul.toml > "$work/more.toml"
cp "$work/more.toml" "$work/cold.toml"
sets=(--set M=$n --set N=$n --set K=$n)
t() { local a b; a=$(date +%s.%N); KILN_CACHE_DIR=$1 "$kiln" -q tune --json "$2" "${sets[@]}" > "$3"; b=$(date +%s.%N); echo "$b - $a" | bc; }
s1=$(t "$work/c" "$work/matmul.toml" "$work/1.json")
s2=$(t "$work/c" "$work/more.toml" "$work/2.json")
s3=$(t "$work/c2" "$work/cold.toml" "$work/3.json")
python3 - "$work" "$s1" "$s2" "$s3" <<'PY'
import json, sys
w = sys.argv[1]
rows = [("18 configs, cold", "1.json", sys.argv[2]), ("27 configs, 9 of them new", "2.json", sys.argv[3]),
        ("27 configs, cold", "3.json", sys.argv[4])]
print(f"{'tuning':<28} {'configs':>7} {'timed now':>9} {'re-timed':>8} {'seconds':>8}  chose")
for label, f, secs in rows:
    r = json.load(open(f"{w}/{f}"))
    chose = " ".join(f"{k}={v}" for k, v in r["best"].items())
    print(f"{label:<28} {r['space_size']:>7} {r['timed_now']:>9} {r['retimed_now']:>8} {float(secs):8.2f}  {chose}")
PY
