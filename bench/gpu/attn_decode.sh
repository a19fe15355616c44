#!/usr/bin/env bash
# Attention over a KV cache (SPEC, by default kernels/cuda/attention_bf16.toml: the decode split and prefill on the tensor cores; Llama-3-8B's
# heads: 32 query heads, 8 KV heads of 128) against the device's copy bandwidth and PyTorch's
# scaled_dot_product_attention (issue 27, "decode attention alone"). kiln: `kiln tune` of the
# multi-kernel at each (T, S): each variant (a split of 64, 256 or 1024 keys, then the
# combination) timed as single calls after an L2 flush, with its output checked against the
# first variant's. The cache read is (S + T) x 8 x 128 x 2 (K and V) x 2 bytes; its rate is
# given over a 1 GiB device-to-device copy's 2N / t. PyTorch (bench/gpu/torch_attn.py):
# SDPA with enable_gqa, each backend it has forced in turn, timed the same way.
# Usage (GPU machine): bench/gpu/attn_decode.sh [build dir]   (results: $OUT/attn.tgz, $OUT/attn_summary.txt)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
R=$(mktemp -d /tmp/kiln-attn-res-XXXXXX)
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-attn-XXXXXX)}
POINTS=${POINTS:-"1,1024 1,4096 1,8192 1,16384 1,32768 4,8192 16,2048"}
SPEC=${SPEC:-kernels/cuda/attention_bf16.toml}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$R/machine.txt"
timeout 200 python3 bench/gpu/torch_attn.py --points "$POINTS" --out "$R/torch.json" 2>> "$R/stderr.txt" | tail -3
for p in $POINTS; do
  t=${p%,*}; s=${p#*,}
  "$B/kiln" -q tune --json "$SPEC" --set T=$t --set S=$s --set CAP=$((s + t)) \
    --set HQ=32 --set HKV=8 > "$R/kiln_${t}_${s}.json" 2>> "$R/stderr.txt" || echo "tune T=$t S=$s failed: $(tail -2 "$R/stderr.txt")"
done
python3 bench/gpu/attn_summary.py "$R" | tee "$R/summary.txt" "$OUTD/attn_summary.txt"
tar czf "$OUTD/attn.tgz" -C "$R" .
