#!/usr/bin/env bash
# Prefill attention (issue 27, "prefill attention alone"): kiln's attention multi-kernel
# (kernels/cuda/attention_bf16.toml) at prefill points, each variant that can run a point
# timed by `kiln tune` (single calls after an L2 flush, each variant's result checked against
# the first's), beside PyTorch's scaled_dot_product_attention with each backend forced in turn
# and its default (bench/gpu/torch_attn.py: timed the same way, checked against float64).
# The summary (attn_prefill_summary.py) gives, per point, the mma.sync and the wgmma prefill
# forms, every SDPA backend, their TFLOP/s and the ratios.
# PARTS, in this order: configs (each wgmma config timed alone: `kiln tune --json` of
# attn_prefill_wg_bf16.toml), tests (the attention GPU tests, every variant forced against
# float64: TESTS),
# peers (the multi-kernel and SDPA).
# Usage (GPU machine): bench/gpu/attn_prefill.sh [build dir]   (results: $OUT/prefill.tgz, $OUT/prefill_summary.txt,
#   $OUT/records.tgz: the tuning records, which RECORDS_IN=F gives a later run; bench/gpu/env.sh)
set -uo pipefail
source "$(dirname "$0")/env.sh"
R=$(mktemp -d /tmp/kiln-prefill-res-XXXXXX)
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-prefill-XXXXXX)}
records_in  # RECORDS_IN=F: records an earlier run wrote (bench/gpu/env.sh)
POINTS=${POINTS:-"4096,0 8192,0 16384,0 1024,0 2000,3000"}
PARTS=${PARTS:-tests,configs,peers}
TESTS=${TESTS:-AttentionTest.AttentionOnTheGpu*}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$R/machine.txt"
if [[ $PARTS == *configs* ]]; then
  for p in $POINTS; do
    t=${p%,*}; s=${p#*,}
    timeout 120 "$B/kiln" -q tune --json kernels/cuda/attn_prefill_wg_bf16.toml --set T=$t --set S=$s \
      --set CAP=$((s + t)) --set HQ=32 --set HKV=8 > "$R/wg_${t}_${s}.json" 2>> "$R/stderr.txt" || echo "wg tune T=$t S=$s failed: $(tail -2 "$R/stderr.txt")"
  done
fi
if [[ $PARTS == *tests* ]]; then
  timeout ${TEST_TIMEOUT:-240} stdbuf -oL "$B/tests/kiln_tests" --gtest_filter="$TESTS" > "$R/tests.log" 2>&1
  echo "tests: exit code $? ($(grep -E '^\[  (PASSED|FAILED)' "$R/tests.log" | tr '\n' ' '))"
fi
if [[ $PARTS == *peers* ]]; then
  timeout ${TORCH_TIMEOUT:-300} python3 bench/gpu/torch_attn.py --points "$POINTS" --out "$R/torch.json" 2>> "$R/stderr.txt" | tail -8
  for p in $POINTS; do
    t=${p%,*}; s=${p#*,}
    timeout 200 "$B/kiln" -q tune --json kernels/cuda/attention_bf16.toml --set T=$t --set S=$s --set CAP=$((s + t)) \
      --set HQ=32 --set HKV=8 > "$R/kiln_${t}_${s}.json" 2>> "$R/stderr.txt" || echo "tune T=$t S=$s failed: $(tail -2 "$R/stderr.txt")"
  done
fi
python3 bench/gpu/attn_prefill_summary.py "$R" | tee "$R/summary.txt" "$OUTD/prefill_summary.txt"
tar czf "$OUTD/prefill.tgz" -C "$R" .
records_out
