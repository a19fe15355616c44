#!/usr/bin/env bash
# Budgeted search against every config on the GPU: the cuda matmul over its
# wide space (kernels/cuda/matmul_search.toml, 36,864 configs). An exhaustive
# tuning of thousands of configs takes longer than one sitting of a shared
# machine, so it runs under a time budget and is resumed:
#   bench/gpu/search.sh BUILD MxNxK
# 1. kiln tune --effort quick (once; its output is kept);
# 2. kiln tune --effort full --budget-seconds $FULL_BUDGET: times what the record
#    lacks, in batches, and keeps what it timed when the budget runs out;
#    run the script again until it prints the summary line.
# The cache and outputs live in .cache/search-MxNxK; copies go to $OUT/search.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}; SHAPE=${2:-1200x2302x1000}
SPEC=kernels/cuda/matmul_search.toml
export OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT/search" .cache && chmod 700 .cache
export KILN_KERNELS_DIR=$PWD/kernels KILN_BENCH_BUDGET_MS=${KILN_BENCH_BUDGET_MS:-10}
if [ -f "$B/lib/libxgboost.so.0" ]; then
  export KILN_XGBOOST_LIB=$PWD/$B/lib/libxgboost.so.0 LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
fi
W=$PWD/.cache/search-$SHAPE
mkdir -p "$W/cache" && chmod 700 "$W/cache"
export KILN_CACHE_DIR=$W/cache
set -- ${SHAPE//x/ }
tag=matmul_search-$SHAPE
if [ ! -s "$W/quick-$tag.json" ]; then
  "$B/kiln" -q tune $SPEC --set M=$1 --set N=$2 --set K=$3 --effort quick --json > "$W/quick-$tag.json" 2>> "$W/err.txt"
  echo "quick: exit $? at $SECONDS s"
fi
"$B/kiln" -q tune $SPEC --set M=$1 --set N=$2 --set K=$3 --effort full --budget-seconds ${FULL_BUDGET:-400} --json \
  > "$W/full-$tag.json" 2>> "$W/err.txt"
echo "full: exit $? at $SECONDS s"
cp "$W"/*.json "$W/err.txt" "$OUT/search/" 2>/dev/null
python3 - "$W/full-$tag.json" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
timed = sum(1 for c in f["configs"] if c["result"] not in ("pruned", "unavailable"))
print("full record: %d configs with results; start: %s" % (timed, f["start"]))
PY
if ! grep -q "stopped by its time budget" "$W/full-$tag.json"; then
  python3 bench/search/summarize.py $SPEC "$SHAPE" "$W/quick-$tag.json" "$W/full-$tag.json" "$OUT/search/fixtures"
fi
