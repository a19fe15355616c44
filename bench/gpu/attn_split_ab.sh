#!/usr/bin/env bash
# The decode attention's split rows divided by their sums, and clusters of 16 for the one-launch
# split, against the tree before (OLD, made with
#   mkdir -p ab-old && git archive <commit> kernels | tar -x -C ab-old):
# first the GPU attention tests (every variant forced, against float64, S up to 8192), then
# every variant of attention_bf16 timed at T = 1 over long caches (bench/gpu/attn_decode.sh,
# PyTorch SDPA beside it; the new tree only), then the decoder layer from both trees
# (bench/gpu/ab_kernels.sh: GEMM tunings shared, whole calls back to back, the new tree checked).
# Usage (GPU machine): OLD=ab-old bench/gpu/attn_split_ab.sh [build dir]   (results under $OUT)
#   SIZES (default "8192 16384 32768") for the attention alone; POINTS for the layer (default "1,8192 1,32768")
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
timeout 200 "$B/tests/kiln_tests" --gtest_filter='AttentionTest.*Gpu*' 2>&1 | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |Failure|want" | head -30 | tee "$OUTD/tests.log"
SIZES=${SIZES:-"8192 16384 32768"}
mkdir -p "$OUTD/attn"
POINTS=$(for s in $SIZES; do printf '1,%s ' "$s"; done) OUT=$OUTD/attn timeout 240 bash bench/gpu/attn_decode.sh "$B" | tail -6
POINTS=${POINTS:-"1,8192 1,32768"} MODEL=0 timeout 400 bash bench/gpu/ab_kernels.sh "$B" | grep -v "^ "
