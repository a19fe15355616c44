#!/usr/bin/env bash
# A kernel patch measured against the kernels as they are, kernel by kernel, in one run on one
# GPU. On the GPU machine's copy of the tree: the kernels copied aside (old), PATCH applied in
# place (new), the GPU tests TESTS run on the patched tree, then each point tuned over its
# templates alone (`kiln tune --json --effort full --no-library --force`: single calls after an
# L2 flush, every config's result checked against the first's) from old, new, old, new; the
# table gives each tree's best of its two tunings and new / old. The patch is taken back after.
# Usage (GPU machine): PATCH=bench/gpu/patches/X.diff POINTS="..." TESTS=... bench/gpu/spec_ab.sh [build dir]
#   POINTS: lines "SPEC NAME=VALUE ..." (SPEC relative to kernels/, as cuda/gemm_tma.toml:bf16_nt)
#   Results: $OUT/spec_ab.tgz, $OUT/spec_ab_summary.txt. The patches and their points:
#   bench/gpu/patches/README.md.
set -uo pipefail
source "$(dirname "$0")/env.sh"
: "${PATCH:?PATCH: the patch to measure}" "${POINTS:?POINTS: lines of SPEC NAME=VALUE ...}"
R=$(mktemp -d /tmp/kiln-spec-ab-XXXXXX)
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-spec-ab-cache-XXXXXX)}
W=$(mktemp -d /tmp/kiln-spec-old-XXXXXX)
cp -r kernels "$W/"
git apply "$PATCH" || { echo "$PATCH does not apply"; exit 1; }
trap 'git apply -R "$PATCH"' EXIT
if [ -n "${TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-240}" "$B/tests/kiln_tests" --gtest_filter="$TESTS" > "$R/tests.log" 2>&1
  echo "tests (patched tree): exit code $? ($(grep -E '^\[  (PASSED|FAILED)' "$R/tests.log" | tr '\n' ' '))"
fi
i=0
while read -r spec sets; do
  [ -n "$spec" ] || continue
  args=()
  for a in $sets; do args+=(--set "$a"); done
  for round in 1 2; do
    for tree in old new; do
      root=.; [ $tree = old ] && root=$W
      timeout "${TUNE_TIMEOUT:-300}" "$B/kiln" -q tune --json --effort full --no-library --force "$root/kernels/$spec" "${args[@]}" \
        > "$R/${i}_${tree}_$round.json" 2>> "$R/stderr.txt" || echo "$spec $sets $tree round $round: failed ($(tail -1 "$R/stderr.txt"))"
    done
  done
  echo "$i $spec $sets" >> "$R/points.txt"
  i=$((i + 1))
done <<< "$POINTS"
python3 - "$R" <<'PY' | tee "$R/summary.txt" "$OUTD/spec_ab_summary.txt"
import json, os, sys
r = sys.argv[1]
print(f"{'point':>48} {'old us':>9} {'new us':>9} {'new/old':>8}  best configs (old | new)")
for line in open(os.path.join(r, "points.txt")):
    i, point = line.split(None, 1)
    best = {}
    for tree in ("old", "new"):
        for rnd in (1, 2):
            try:
                j = json.load(open(os.path.join(r, f"{i}_{tree}_{rnd}.json")))
            except (OSError, ValueError):
                continue
            if j.get("best_ns") and (tree not in best or j["best_ns"] < best[tree][0]):
                best[tree] = (j["best_ns"], " ".join(f"{a}={b}" for a, b in sorted(j["best"].items())))
    o, n = best.get("old"), best.get("new")
    us = lambda b: f"{b[0] / 1e3:9.1f}" if b else f"{'-':>9}"
    ratio = f"{n[0] / o[0]:8.3f}" if o and n else f"{'-':>8}"
    print(f"{point.strip()[:48]:>48} {us(o)} {us(n)} {ratio}  {o[1] if o else '-'} | {n[1] if n else '-'}")
print("(each tree's best of two full tunings, single calls after an L2 flush; below 1 the patch is faster)")
PY
tar czf "$OUTD/spec_ab.tgz" -C "$R" .
