#!/usr/bin/env bash
# Where the wgmma prefill attention (kernels/cuda/attn_prefill_wg.cu) spends its time: the
# one-step program bench/gpu/programs/attn_prefill_wg.toml tuned at each point (its configs
# timed by the program's first call), then one launch of the tuned kernel under Nsight Compute
# (clocks left alone): the details page (throughput, pipes, warp stalls, occupancy) and the
# SASS with each instruction's sampled stalls, for the kernel as kiln compiled it, and a
# summary of those (bench/gpu/ncu_sass_summary.py: stalls by reason, instructions by opcode).
# Usage (GPU machine): bench/gpu/attn_prefill_profile.sh [build dir]   (results: $OUT/prefill_profile.tgz)
#   POINTS (default "8192,0"), SET (ncu's section set, default full)
set -uo pipefail
source "$(dirname "$0")/env.sh"
R=$(mktemp -d /tmp/kiln-prefill-prof-XXXXXX)
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-prefill-prof-cache-XXXXXX)}
POINTS=${POINTS:-"8192,0"}
P=bench/gpu/programs/attn_prefill_wg.toml
NCU=$(find_ncu)
echo "ncu: $NCU"
for p in $POINTS; do
  t=${p%,*}; s=${p#*,}
  timeout 200 "$B/kiln" -q run --json "$P" --set T=$t --set S=$s --set CAP=$((s + t)) > "$R/tuned_${t}_${s}.json" 2> "$R/tuned_${t}_${s}.err"
  echo "T=$t S=$s tuned: exit code $?"
  "$B/kiln" report kernels/cuda/attn_prefill_wg_bf16.toml --set T=$t --set S=$s --set CAP=$((s + t)) \
    --set HQ=32 --set HKV=8 > "$R/report_${t}_${s}.txt" 2>&1
  head -30 "$R/report_${t}_${s}.txt"
  timeout 240 "$NCU" --clock-control none -k regex:attn_prefill_wg --launch-count 1 --set "${SET:-full}" \
    --import-source no -f -o "$R/prof_${t}_${s}" \
    "$B/kiln" -q run --reps 1 --calls 1 "$P" --set T=$t --set S=$s --set CAP=$((s + t)) > "$R/ncu_${t}_${s}.log" 2>&1
  echo "ncu T=$t S=$s: exit code $?"
  "$NCU" -i "$R/prof_${t}_${s}.ncu-rep" --page details > "$R/details_${t}_${s}.txt" 2>&1
  "$NCU" -i "$R/prof_${t}_${s}.ncu-rep" --page source --print-source sass --csv > "$R/sass_${t}_${s}.csv" 2>&1
  python3 bench/gpu/ncu_sass_summary.py "$R/sass_${t}_${s}.csv" > "$R/stalls_${t}_${s}.txt" 2>&1
  head -14 "$R/stalls_${t}_${s}.txt"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Eligible Warps" "$R/details_${t}_${s}.txt" | head -20
done
tar czf "$OUTD/prefill_profile.tgz" -C "$R" .
