#!/usr/bin/env bash
# Dispatch plans and budgeted search on the GPU (the cuda fp32 matmul):
#   1. kiln plan: training on a log2 grid (M, N, K in 64..4096, 3 values
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
  timeout ${PLAN_TIMEOUT:-540} "$B/kiln" plan kernels/cuda/matmul.toml --grid M=64:4096:3 --grid N=64:4096:3 --grid K=64:4096:3 \
    --eval bench/plan/cuda_eval.txt > "$R/plan.txt" 2> "$R/plan.err"
  echo "exit $?"
  cat "$R/plan.txt"
  tail -3 "$R/plan.err"
fi
if [ "$PART" = search ] || [ "$PART" = all ]; then
  echo "== 2. budgeted search against every config (templates only)"
  printf "%-22s %10s %8s %8s %10s %8s %8s %8s\n" "M x N x K" "quick us" "timed" "secs" "full us" "timed" "secs" "ratio"
  for shape in "1024 1024 1024" "96 2048 3000" "2000 3000 20" "4096 4096 4096"; do
    set -- $shape
    c=$(mktemp -d /tmp/kiln-search-XXXXXX)
    q=$(KILN_CACHE_DIR=$c timeout ${TUNE_TIMEOUT:-300} "$B/kiln" -q tune kernels/cuda/matmul.toml --set M=$1 --set N=$2 --set K=$3 --no-library --effort quick --json 2>>"$R/search.err")
    f=$(KILN_CACHE_DIR=$c timeout ${TUNE_TIMEOUT:-300} "$B/kiln" -q tune kernels/cuda/matmul.toml --set M=$1 --set N=$2 --set K=$3 --no-library --effort full --json 2>>"$R/search.err")
    echo "$q" > "$R/quick-$1x$2x$3.json"; echo "$f" > "$R/full-$1x$2x$3.json"
    python3 - "$1x$2x$3" "$q" "$f" <<'PY'
import json, sys
name, q, f = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
qt, ft = q["best_ns"] / 1e3, f["best_ns"] / 1e3
print("%-22s %10.1f %8d %8.1f %10.1f %8d %8.1f %7.3fx" % (name, qt, q["timed_now"], q["seconds"], ft,
      q["timed_now"] + f["timed_now"], q["seconds"] + f["seconds"], qt / ft))
print("  quick: %s" % q["start"])
PY
    rm -rf "$c"
  done
fi
