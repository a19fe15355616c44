#!/usr/bin/env bash
# Why decode attention at long S streams its cache below the copy bandwidth (issue 27, "decode
# attention alone"): every variant of attention_bf16 timed at T = 1, S = 8192 and 32768
# (bench/gpu/attn_decode.sh, with PyTorch SDPA beside it), then the decoder layer tuned at each
# S and run again under Nsight Compute, which reports the chosen attention kernel's
# throughput, occupancy, warp stalls and memory traffic (one launch, clocks left alone).
# Usage (GPU machine): bench/gpu/attn_profile.sh [build dir]   (results: $OUT/attn_profile/)
#   SIZES (default "8192 32768")
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
R=$OUTD/attn_profile
mkdir -p "$R"
SIZES=${SIZES:-"8192 32768"}
POINTS=$(for s in $SIZES; do printf '1,%s ' "$s"; done) OUT=$R timeout 300 bash bench/gpu/attn_decode.sh "$B" | tail -8
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-attn-profile-cache}
P=kernels/programs/decoder_llama3_8b.toml
NCU=$(find_ncu)
echo "ncu: $NCU"
for s in $SIZES; do
  timeout 300 "$B/kiln" -q run --json "$P" --set T=1 --set S=$s --set CAP=$((s + 2)) > "$R/layer_$s.json" 2> "$R/layer_$s.err"
  echo "layer S=$s tuned: exit code $?"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); [print(f\"  {x['ns']/1e3:8.1f} us  {x['choice']}\") for x in j['steps'] if 'attention' in x['choice']]" "$R/layer_$s.json"
  timeout 200 "$NCU" --clock-control none -k regex:attn_ --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats \
    "$B/kiln" -q run --reps 1 --calls 2 "$P" --set T=1 --set S=$s --set CAP=$((s + 2)) > "$R/ncu_$s.txt" 2>&1
  echo "ncu S=$s: exit code $?"
  grep -E "attn_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Waves Per SM|Grid Size|Block Size|Stall|Warp Cycles Per Issued|Eligible Warps|Issued Warp|L2 Hit|Mem Busy|Max Bandwidth" "$R/ncu_$s.txt" | head -60
done
