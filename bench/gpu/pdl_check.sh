#!/usr/bin/env bash
# Overlapping launches (a spec's pdl) on the GPU, each figure with KILN_PDL=1 and =0 from
# one tuning (the same cache, back to back in one process each): the overlapped-launch
# test and the graph, decoder and model tests; the device-to-device copy bandwidth (1 GiB,
# read + write, PyTorch's copy timed with CUDA events); the Llama-3-8B MLP block at T = 1
# (kernels/programs/mlp_llama3_8b.toml, --check); the decoder layer at T = 1, S = 1024 with
# a decode loop (--check); with PARTS including model, the whole model at T = 1, S = 1024.
# Usage (GPU machine): bench/gpu/pdl_check.sh [build dir]   (PARTS=tests,copy,mlp,layer,model;
# results under $OUT; KILN_CACHE_DIR kept in /tmp/kiln-pdl-cache for a later call)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
PARTS=${PARTS:-tests,copy,mlp,layer}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-pdl-cache}
mkdir -p "$KILN_CACHE_DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
summary() { grep -E "first call|back to back|decode loop|check (passed|FAILED)|all within|worst|error" "$1" | grep -v "^kiln: warning" | head -12; }
if has tests; then
  echo "== tests"
  timeout ${TEST_TIMEOUT:-240} "$B/tests/kiln_tests" \
    --gtest_filter="${TESTS:-ProgramTest.AnOverlapped*:ProgramTest.Graph*:ProgramTest.AGraph*:CudaTest.LaunchesTunes*:ModelTest.*:DecoderTest.ADecodeLoop*}" \
    > "$OUTD/tests.log" 2>&1
  echo "exit code $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|Failure" "$OUTD/tests.log" | head -30
fi
if has copy; then
  echo "== copy bandwidth"
  python3 - <<'PY' 2>&1 | tee "$OUTD/copy.txt"
import torch
n = 1 << 29  # 1 GiB of bf16
a = torch.empty(n, dtype=torch.bfloat16, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); b.copy_(a); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
t = sorted(ts)[len(ts) // 2]
print(f"copy: {2 * a.numel() * 2 / t / 1e9:.0f} GB/s (1 GiB read + 1 GiB written, median of 10: {t * 1e3:.3f} ms)")
PY
fi
run() {  # name, pdl, args...
  local name=$1 pdl=$2; shift 2
  local t0=$(date +%s.%N)
  KILN_PDL=$pdl timeout ${RUN_TIMEOUT:-300} "$B/kiln" -q run "$@" > "$OUTD/$name.txt" 2>&1
  local rc=$?
  echo "-- $name (KILN_PDL=$pdl): exit code $rc after $(python3 -c "import sys; print('%.1f s' % (float(sys.argv[2]) - float(sys.argv[1])))" $t0 $(date +%s.%N))"
  summary "$OUTD/$name.txt"
}
if has mlp; then
  echo "== MLP block, T = 1"
  P=kernels/programs/mlp_llama3_8b.toml
  run mlp_pdl1_first 1 --check "$P" --set T=1 --calls 500
  run mlp_pdl0 0 "$P" --set T=1 --calls 500
  run mlp_pdl1 1 "$P" --set T=1 --calls 500
  grep -E "^ +[0-9]+ +[0-9.]+us" "$OUTD/mlp_pdl1.txt" | head -4
fi
if has layer; then
  echo "== decoder layer, T = 1, S = 1024"
  P=kernels/programs/decoder_llama3_8b.toml
  LOOP=${LOOP:-1000}
  run layer_pdl1_first 1 --check --loop S=$LOOP "$P" --set T=1 --set S=1024 --set CAP=$((1025 + LOOP))
  run layer_pdl0 0 --check --loop S=$LOOP "$P" --set T=1 --set S=1024 --set CAP=$((1025 + LOOP))
  run layer_pdl1 1 --loop S=$LOOP "$P" --set T=1 --set S=1024 --set CAP=$((1025 + LOOP))
fi
if has model; then
  echo "== whole model, T = 1, S = 1024"
  M=kernels/programs/model_llama3_8b.toml
  ML=${MODEL_LOOP:-200}
  run model_pdl1_first 1 --loop S=$ML --calls 50 "$M" --set T=1 --set S=1024 --set CAP=$((1025 + ML))
  run model_pdl0 0 --loop S=$ML --calls 50 "$M" --set T=1 --set S=1024 --set CAP=$((1025 + ML))
  run model_pdl1 1 --loop S=$ML --calls 50 "$M" --set T=1 --set S=1024 --set CAP=$((1025 + ML))
fi
