#!/usr/bin/env bash
# The TMA GEMM family's producer thread sleeping in its waits for a free stage
# (bench/gpu/patches/gemm_tma_producer_sleep.diff, not applied in the repository until
# measured) against the family as it is. In the wgmma prefill attention the same producer's
# polling was a tenth of the instructions issued (bench/gpu/results/issue27-prefill-wg/run3b).
# On the GPU machine's copy of the tree: the kernels as they are copied aside (old), the patch
# applied in place (new), the GEMM GPU tests run on it, then each member of SHAPES tuned over
# its templates alone (`kiln tune --effort full --no-library --json`, single calls after an L2
# flush, every result checked against the first config's) from old, new, old, new; the table
# gives each tree's best of its two tunings and new / old. The patch is taken back after.
# Usage (GPU machine): bench/gpu/gemm_sleep_ab.sh [build dir]   (results: $OUT/gemm_sleep.tgz, $OUT/gemm_sleep_summary.txt)
#   SHAPES: lines "member M N K" (default below)
set -uo pipefail
source "$(dirname "$0")/env.sh"
R=$(mktemp -d /tmp/kiln-gemm-sleep-XXXXXX)
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-gemm-sleep-cache-XXXXXX)}
W=$(mktemp -d /tmp/kiln-gemm-old-XXXXXX)
cp -r kernels "$W/"
git apply bench/gpu/patches/gemm_tma_producer_sleep.diff || { echo "the patch does not apply"; exit 1; }
trap 'git apply -R bench/gpu/patches/gemm_tma_producer_sleep.diff' EXIT
SHAPES=${SHAPES:-"bf16_nt_gated 4096 14336 4096
bf16_nt 4096 4096 4096
bf16_nt 8192 8192 8192
bf16_nt 1024 6144 4096"}
timeout ${TEST_TIMEOUT:-240} "$B/tests/kiln_tests" --gtest_filter="${TESTS:-CudaTest.TheTma*:CudaTest.TheGemmHandlesForms*}" > "$R/tests.log" 2>&1
echo "tests (new tree): exit code $? ($(grep -E '^\[  (PASSED|FAILED)' "$R/tests.log" | tr '\n' ' '))"
i=0
while read -r member m n k; do
  [ -n "$member" ] || continue
  for round in 1 2; do
    for tree in old new; do
      root=.; [ $tree = old ] && root=$W
      timeout 300 "$B/kiln" -q tune --json --effort full --no-library --force "$root/kernels/cuda/gemm_tma.toml:$member" \
        --set M=$m --set N=$n --set K=$k > "$R/${i}_${tree}_$round.json" 2>> "$R/stderr.txt" ||
        echo "$member $m $n $k $tree round $round: failed ($(tail -1 "$R/stderr.txt"))"
    done
  done
  echo "$i $member $m $n $k" >> "$R/shapes.txt"
  i=$((i + 1))
done <<< "$SHAPES"
python3 - "$R" <<'PY' | tee "$R/summary.txt" "$OUTD/gemm_sleep_summary.txt"
import json, os, sys
r = sys.argv[1]
print(f"{'member':>14} {'M':>6} {'N':>6} {'K':>6} {'old us':>9} {'new us':>9} {'new/old':>8}  best configs (old | new)")
for line in open(os.path.join(r, "shapes.txt")):
    i, member, m, n, k = line.split()
    best = {}
    for tree in ("old", "new"):
        for rnd in (1, 2):
            try:
                j = json.load(open(os.path.join(r, f"{i}_{tree}_{rnd}.json")))
            except (OSError, ValueError):
                continue
            if j.get("best_ns") and (tree not in best or j["best_ns"] < best[tree][0]):
                best[tree] = (j["best_ns"], " ".join(f"{a}={b}" for a, b in sorted(j["best"].items())))
    o, nw = best.get("old"), best.get("new")
    ratio = f"{nw[0] / o[0]:8.3f}" if o and nw else f"{'-':>8}"
    print(f"{member:>14} {m:>6} {n:>6} {k:>6} {o[0] / 1e3 if o else float('nan'):9.1f} {nw[0] / 1e3 if nw else float('nan'):9.1f} {ratio}  "
          f"{o[1] if o else '-'} | {nw[1] if nw else '-'}")
print("(each tree's best of two full tunings, single calls after an L2 flush; below 1 the patch is faster)")
PY
tar czf "$OUTD/gemm_sleep.tgz" -C "$R" .
