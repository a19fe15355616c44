#!/usr/bin/env bash
# Where a decode step's time goes: the decoder layer (kernels/programs/decoder_llama3_8b.toml)
# at T = 1, S = 1024, tuned in one process (`kiln run --json`: call_ns is whole calls back to
# back, graphs replayed), then a second process on the same cache under Nsight Compute, which
# times every kernel of a few calls alone (serialised, clocks left alone), with the DRAM bytes
# each read and wrote. The summary (layer_profile.py) sets each kernel's time against its
# bytes at the device-copy bandwidth measured in the same run, and the sum of the kernels
# against the whole call (less than the sum where launches overlap; more where gaps remain).
# Usage (GPU machine): bench/gpu/layer_profile.sh [build dir]   (results: $OUT/profile/)
#   T, S (default 1, 1024); PROGRAM (default the layer)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
R=$OUTD/profile
mkdir -p "$R"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-profile-cache}
P=${PROGRAM:-kernels/programs/decoder_llama3_8b.toml}
T=${T:-1}; S=${S:-1024}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/machine.txt"
python3 bench/gpu/copy_bandwidth.py | tee "$R/copy_bandwidth.txt"
timeout 400 "$B/kiln" -q run --json "$P" --set T=$T --set S=$S --set CAP=$((S + T + 1)) > "$R/tuned.json" 2> "$R/tuned.err"
echo "tuned: exit code $?"
NCU=$(find_ncu)
echo "ncu: $NCU"
timeout 300 "$NCU" --clock-control none --csv --print-units base --log-file "$R/ncu.csv" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  "$B/kiln" -q run --json --reps 1 --calls 2 "$P" --set T=$T --set S=$S --set CAP=$((S + T + 1)) \
  > "$R/ncu.out" 2> "$R/ncu.err"
echo "ncu: exit code $?"
python3 bench/gpu/layer_profile.py "$R" | tee "$R/summary.txt"
