#!/usr/bin/env bash
# Dispatch plans and budgeted search on the GPU (the cuda fp32 matmul):
#   1. kiln plan: training on a log2 grid (M, N in 64..4096, K in 16..4096, 3 values
#      each: 27 shapes), evaluated on bench/plan/cuda_eval.txt (none a
#      training shape): plan / oracle and hint / oracle per shape;
#   2. budgeted search (--effort quick) against every config (--effort full,
#      which then times the rest) at a few shapes, templates only.
# Usage (on the GPU machine, with build-gpu-carry from scripts/gpu-carry.sh):
#   bench/gpu/plan_and_search.sh [build dir] [plan|search|all]
# Results go to $OUT/plan (text and JSON).
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
PART=${2:-all}
R=${OUT:-/tmp/kiln-gpu-out}/plan
mkdir -p "$R"
export KILN_KERNELS_DIR=$PWD/kernels
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-plan-cache}
export KILN_BENCH_BUDGET_MS=${KILN_BENCH_BUDGET_MS:-10}
# XGBoost, carried beside the binaries when the machine has none.
if [ -f "$B/lib/libxgboost.so.0" ]; then
  export KILN_XGBOOST_LIB=$PWD/$B/lib/libxgboost.so.0
  export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
fi
if [ "$PART" = plan ] || [ "$PART" = all ]; then
  echo "== 1. kiln plan (cuda matmul)"
  timeout ${PLAN_TIMEOUT:-540} "$B/kiln" plan kernels/cuda/matmul.toml --grid M=64:4096:3 --grid N=64:4096:3 --grid K=16:4096:3 \
    --eval bench/plan/cuda_eval.txt ${PLAN_FLAGS:-} > "$R/plan.txt" 2> "$R/plan.err"
  echo "exit $?"
  cat "$R/plan.txt"
  tail -3 "$R/plan.err"
fi
if [ "$PART" = search ] || [ "$PART" = all ]; then
  echo "== 2. budgeted search against every config (templates only)"
  echo "quick: --effort quick (budgeted); full: every config (the rest timed after quick, same cache);"
  echo "us: the time of each one's choice in the full record; ratio: quick's choice / the best of all"
  printf "%-22s %10s %8s %8s %10s %8s %8s %8s\n" "M x N x K" "quick us" "timed" "secs" "full us" "timed" "secs" "ratio"
  for shape in ${SEARCH_SHAPES:-1024x1024x1024 96x2048x3000 2000x3000x20 4096x4096x4096}; do
    set -- ${shape//x/ }
    c=$(mktemp -d /tmp/kiln-search-XXXXXX)
    KILN_CACHE_DIR=$c timeout ${TUNE_TIMEOUT:-300} "$B/kiln" -q tune kernels/cuda/matmul.toml --set M=$1 --set N=$2 --set K=$3 --no-library --effort quick --json > "$R/quick-$1x$2x$3.json" 2>>"$R/search.err"
    KILN_CACHE_DIR=$c timeout ${TUNE_TIMEOUT:-300} "$B/kiln" -q tune kernels/cuda/matmul.toml --set M=$1 --set N=$2 --set K=$3 --no-library --effort full --json > "$R/full-$1x$2x$3.json" 2>>"$R/search.err"
    python3 - "$1x$2x$3" "$R/quick-$1x$2x$3.json" "$R/full-$1x$2x$3.json" <<'PY'
import json, sys
name, q, f = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
times = {json.dumps(c["params"], sort_keys=True): c["ns"] for c in f["configs"] if c["ns"]}
qb = times.get(json.dumps(q["best"], sort_keys=True), q["best_ns"])
print("%-22s %10.1f %8d %8.1f %10.1f %8d %8.1f %7.3fx" % (name, qb / 1e3, q["timed_now"], q["seconds"], f["best_ns"] / 1e3,
      q["timed_now"] + f["timed_now"], q["seconds"] + f["seconds"], qb / f["best_ns"]))
print("  quick: %s" % q["start"])
PY
    rm -rf "$c"
  done
fi
