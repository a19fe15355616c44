#!/usr/bin/env bash
# A leaner loop for the tensor-core split attention (bench/gpu/patches/attn_lean_loop.diff, not
# applied in the repository until measured): its cache rows addressed from each lane's first row
# advanced by whole rows, and the slice and causal edge compared as ints (no 64-bit index
# arithmetic a copy or a score: 155-165 registers a thread instead of 172-224 for the split's
# configs, NVRTC sm_90), and the online softmax's rescale of the outputs skipped by a warp none
# of whose rows has a new max (the factor is then exactly 1: results unchanged).
# On the GPU machine's copy of the tree: the kernels as they are copied aside (old), the patch
# applied in place, the GPU attention tests run on it (every variant forced, against float64),
# every variant timed at T = 1 over long caches (bench/gpu/attn_decode.sh), then the layer from
# both trees (bench/gpu/ab_kernels.sh, the patched tree checked); the patch is taken back after.
# Usage (GPU machine): bench/gpu/attn_lean_ab.sh [build dir]   (results under $OUT)
#   SIZES (default "8192 32768") for the attention alone; POINTS for the layer (default "1,1024 1,8192 1,32768")
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
W=$(mktemp -d /tmp/kiln-lean-XXXXXX)
mkdir -p "$W/old" && cp -r kernels "$W/old/"
git apply bench/gpu/patches/attn_lean_loop.diff || { echo "the patch does not apply"; exit 1; }
trap 'git apply -R bench/gpu/patches/attn_lean_loop.diff' EXIT
timeout 200 "$B/tests/kiln_tests" --gtest_filter='AttentionTest.*Gpu*' 2>&1 | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |Failure|want" | head -30 | tee "$OUTD/tests.log"
SIZES=${SIZES:-"8192 32768"}
mkdir -p "$OUTD/attn"
POINTS=$(for s in $SIZES; do printf '1,%s ' "$s"; done) OUT=$OUTD/attn timeout 200 bash bench/gpu/attn_decode.sh "$B" | tail -5
OLD=$W/old POINTS=${POINTS:-"1,1024 1,8192 1,32768"} MODEL=0 timeout 420 bash bench/gpu/ab_kernels.sh "$B" | grep -v "^ "
