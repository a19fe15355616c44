#!/usr/bin/env bash
# cuDNN's fused attention as a library choice (cudnn_attn_bf16, docs/libraries.md): where the
# machine's libcudnn is, whether kiln can use it (`kiln backends`), and its GPU test
# (AttentionTest.Cudnn*: against float64, NaN rows past the keys, S from a cell), then
# bench/gpu/attn_prefill.sh with PARTS (default: configs, which times cuDNN beside each wgmma
# config in one `kiln tune` per point).
# Usage (GPU machine): bench/gpu/cudnn_attn.sh [build dir]   (results: $OUT/cudnn.txt and attn_prefill.sh's)
set -uo pipefail
source "$(dirname "$0")/env.sh"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "libcudnn: $(ls ${LD_LIBRARY_PATH//:/ } 2>/dev/null | grep -m1 'libcudnn.so.9' || echo none on LD_LIBRARY_PATH)"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  "$B/kiln" backends 2>&1 | grep -A3 "^cuda"
  timeout ${CUDNN_TEST_TIMEOUT:-180} "$B/tests/kiln_tests" --gtest_filter='AttentionTest.Cudnn*' 2>&1 | tail -40
} 2>&1 | tee "$OUTD/cudnn.txt"
PARTS=${PARTS:-configs} bash "$(dirname "$0")/attn_prefill.sh" "$B"
