#!/usr/bin/env bash
# The RMSNorm with its row held in registers (rmsnorm_bf16.toml, RR > 0) and RoPE moving 16
# bytes a thread (rope_cache_bf16.toml, V = 1), against their earlier forms (RR = 0, V = 0):
#   tests  the GPU tests of both kernels (every config against a computation in double);
#   tune   `kiln tune` of each spec at decode and prefill shapes: every config's time, one
#          tuning, the earlier form's configs beside the new ones (single calls after an L2 flush);
#   ab     the decoder layer from the earlier kernels (OLD, a folder holding that kernels/ tree)
#          and from this tree, bench/gpu/ab_kernels.sh at POINTS (default "1024,0");
#   ncu    (not in the default PARTS) the layer's kernels at PT (default 1024,0) under Nsight Compute
#          (bench/gpu/layer_profile.sh), then PyTorch's torch.compile layer at the same point
#          (bench/gpu/torch_decoder.py --ncu), kernel by kernel.
# Usage (GPU machine): OLD=ab-old bench/gpu/norm_rope_ab.sh [build dir]   PARTS (default
#   "tests tune ab"), RECORDS_IN=F (records of an earlier run: the GEMMs' tunings). Results:
#   $OUT/summary.txt (what this prints), $OUT/all.tgz (every file), $OUT/records.tgz.
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
if [ -z "${_NR_TEE:-}" ]; then _NR_TEE=1 exec > >(tee "$OUTD/summary.txt") 2>&1; fi
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-normrope-cache}
records_in
PARTS=${PARTS:-"tests tune ab"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUTD/machine.txt"
if has tests; then
  timeout 240 "$B/tests/kiln_tests" --gtest_filter='DecoderTest.Rope*:DecoderTest.TheRmsNorm*' > "$OUTD/tests.log" 2>&1
  echo "tests: exit code $? ($(grep -cE '^\[       OK' "$OUTD/tests.log") passed)"; grep -E "FAILED|Failure" "$OUTD/tests.log" | head -20
fi
if has tune; then
  T_OUT=$OUTD/tune.txt; : > "$T_OUT"
  for ts in "1 1024" "1024 0" "4096 0"; do
    set -- $ts
    timeout 120 "$B/kiln" -q tune --json kernels/cuda/rope_cache_bf16.toml --set T=$1 --set S=$2 --set CAP=$(($1 + $2 + 1)) \
      --set HQ=32 --set HKV=8 --set theta=500000 > /tmp/rope.json 2> /tmp/rope.err
    echo "rope T=$1 S=$2 (exit code $?):" >> "$T_OUT"; python3 bench/gpu/tune_times.py /tmp/rope.json V=0 >> "$T_OUT" 2>&1 || tail -3 /tmp/rope.err >> "$T_OUT"
    timeout 120 "$B/kiln" -q tune --json kernels/cuda/rmsnorm_bf16.toml --set T=$1 --set H=4096 --set eps=1e-5 \
      > /tmp/rms.json 2> /tmp/rms.err
    echo "rmsnorm T=$1 H=4096 (exit code $?):" >> "$T_OUT"; python3 bench/gpu/tune_times.py /tmp/rms.json RR=0 >> "$T_OUT" 2>&1 || tail -3 /tmp/rms.err >> "$T_OUT"
  done
  cat "$T_OUT"
fi
if has ab; then
  POINTS=${POINTS:-"1024,0"} timeout ${AB_TIMEOUT:-400} bash bench/gpu/ab_kernels.sh "$B" | tail -12
fi
if has ncu; then
  PT=${PT:-1024,0}
  T=${PT%,*} S=${PT#*,} timeout 200 bash bench/gpu/layer_profile.sh "$B" | tail -14
  NCU=$(find_ncu)
  timeout 200 "$NCU" --clock-control none --profile-from-start off --csv --print-units base --log-file "$OUTD/torch_ncu.csv" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    python3 bench/gpu/torch_decoder.py --out "$OUTD/torch_ncu.json" --points "$PT" --forms compile --ncu > "$OUTD/torch_ncu.out" 2>&1
  echo "torch under ncu: exit code $?"
  python3 bench/gpu/ncu_kernels.py "$OUTD/torch_ncu.csv" "$OUTD/profile/copy_bandwidth.txt" | tee "$OUTD/torch_kernels.txt" | tail -30
  [ -d "$OUTD/profile" ] && tar czf "$OUTD/profile.tgz" -C "$OUTD" profile && rm -rf "$OUTD/profile"
fi
records_out
(cd "$OUTD" && tar czf /tmp/nr-all.tgz --exclude=records.tgz --exclude=summary.txt . && mv /tmp/nr-all.tgz all.tgz &&
  find . -maxdepth 1 -type f ! -name all.tgz ! -name records.tgz ! -name summary.txt -delete && rm -rf profile)
