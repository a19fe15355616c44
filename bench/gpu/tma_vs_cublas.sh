#!/usr/bin/env bash
# The TMA GEMM family (kernels/cuda/gemm_tma.toml) and the wgmma family beside cuBLASLt,
# bf16, C = A . B^T, on LLM shapes with M >= 128 (issue 26, targets 1 and 2). Each shape is
# one `kiln tune --effort full` of each family: the family's templates and cuBLASLt's 8
# ranked algorithms timed in the same tuning, the same way (single calls after an L2 flush,
# kiln's default on the GPU). The table (tma_summary.py) compares the TMA family's best
# template, with and without its clusters (MC) and stream-K (SK), and the wgmma family's where
# it was tuned, with the best cuBLASLt algorithm of the TMA family's tuning.
# Usage (GPU machine): bench/gpu/tma_vs_cublas.sh [build dir] [shapes file]
#   shapes file: lines "M N K" (default: the list below). Results: $OUT/tma.tgz, $OUT/tma_summary.txt.
#   FAMS="tma wgmma" (the default): the families tuned; SECONDS_LEFT=N: no shape is begun
#   after N seconds (the table then holds the shapes done).
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
R=$(mktemp -d /tmp/kiln-tma-res-XXXXXX)
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-tma-XXXXXX)}
if [ -n "${2:-}" ]; then shapes=$(cat "$2"); else
# Llama-3.2-3B, Qwen2.5-7B, Llama-2-13B and Llama-3-70B projections at prompt lengths of
# 128 to 3000 tokens, and the squares 4096 and 8192 (the squares and the shapes furthest from
# cuBLASLt in earlier runs first, for a run cut short by SECONDS_LEFT).
shapes="4096 4096 4096
8192 8192 8192
3000 3584 18944
512 3072 8192
2048 5120 3072
768 13824 5120
128 18944 3584
128 3584 18944
512 8192 3072
768 5120 13824
2048 28672 8192
3000 18944 3584"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$R/machine.txt"
start=$(date +%s)
while read -r m n k; do
  [ -z "$m" ] && continue
  t0=$(date +%s)
  if [ -n "${SECONDS_LEFT:-}" ] && [ $(( t0 - start )) -ge "$SECONDS_LEFT" ]; then
    echo "$m x $n x $k: not begun (past SECONDS_LEFT=$SECONDS_LEFT)"
    continue
  fi
  for fam in ${FAMS:-tma wgmma}; do
    "$B/kiln" -q tune --json "kernels/cuda/gemm_$fam.toml:bf16_nt" --set M=$m --set N=$n --set K=$k --effort full \
      > "$R/${fam}_${m}_${n}_${k}.json" 2>> "$R/stderr.txt" || echo "tune $fam $m $n $k failed: $(tail -2 "$R/stderr.txt")"
  done
  echo "$m x $n x $k: $(( $(date +%s) - t0 )) s"
  tar czf "$OUTD/tma.tgz" -C "$R" .
done <<< "$shapes"
python3 bench/gpu/tma_summary.py "$R" | tee "$R/summary.txt" "$OUTD/tma_summary.txt"
tar czf "$OUTD/tma.tgz" -C "$R" .
