#!/usr/bin/env bash
# Budgeted search against every config, on one kernel spec and a few shapes.
# For each shape, in a fresh cache folder:
#   1. kiln tune --effort quick   (the budgeted search: a surrogate model picks what to time)
#   2. kiln tune --effort full    (every config; what quick timed is reused, the rest is
#                                  timed, and the leaders are re-timed side by side)
# and prints: configs in the space, configs that pass the constraints and the
# device's limits (runnable), how many quick timed, and the time of quick's
# choice against the best of all, both read from the full record (so measured
# in one session, side by side where they are close).
# With FIXTURE_DIR set, the full record's times are written there as a search
# fixture (tests/fixtures/search/): the exhaustive measurement that the test
# SearchFixture replays the budgeted search against.
# Usage: bench/search/run.sh BUILD_DIR SPEC MxNxK [MxNxK ...]
#   env: TUNE_FLAGS (e.g. --no-library), TUNE_TIMEOUT (s, default 3000), OUT (results folder),
#        SEED_CACHE (a cache folder whose compiled binaries each shape starts from, e.g.
#        one kiln compile filled; its tuning records are not used)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:?build dir}; SPEC=${2:?spec}; shift 2
R=${OUT:-/tmp/kiln-search-out}/search
mkdir -p "$R"
export KILN_KERNELS_DIR=$PWD/kernels
if [ -f "$B/lib/libxgboost.so.0" ]; then   # carried beside the binaries (scripts/gpu-carry.sh)
  export KILN_XGBOOST_LIB=$PWD/$B/lib/libxgboost.so.0
  export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
fi
name=$(basename "$SPEC" .toml)
printf "%-18s %7s %9s %12s %9s %9s %10s %10s %8s\n" "M x N x K" "space" "runnable" "quick timed" "quick s" "full s" "quick us" "best us" "ratio"
for shape in "$@"; do
  set -- ${shape//x/ }
  c=$(mktemp -d /tmp/kiln-search-XXXXXX)
  if [ -n "${SEED_CACHE:-}" ]; then
    cp -al "$SEED_CACHE/." "$c/" 2>/dev/null || cp -a "$SEED_CACHE/." "$c/"
    rm -rf "$c/tune"
  fi
  tag=$name-$1x$2x$3
  KILN_CACHE_DIR=$c timeout ${TUNE_TIMEOUT:-3000} "$B/kiln" -q tune "$SPEC" --set M=$1 --set N=$2 --set K=$3 ${TUNE_FLAGS:-} \
    --effort quick --json > "$R/quick-$tag.json" 2>>"$R/$tag.err" || { echo "$shape: quick failed (see $R/$tag.err)"; continue; }
  KILN_CACHE_DIR=$c timeout ${TUNE_TIMEOUT:-3000} "$B/kiln" -q tune "$SPEC" --set M=$1 --set N=$2 --set K=$3 ${TUNE_FLAGS:-} \
    --effort full --json > "$R/full-$tag.json" 2>>"$R/$tag.err" || { echo "$shape: full failed (see $R/$tag.err)"; continue; }
  python3 bench/search/summarize.py "$SPEC" "$shape" "$R/quick-$tag.json" "$R/full-$tag.json" "${FIXTURE_DIR:-}"
  rm -rf "$c"
done
