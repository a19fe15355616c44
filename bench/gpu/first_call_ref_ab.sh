#!/usr/bin/env bash
# A cold first call of the decoder layer (kernels/programs/decoder_llama3_8b.toml, T = 1,
# S = 1024): a fresh process on an empty cache, `kiln run --first-only` (loading, compiling and
# checking what the first call runs; the tunings it queued dropped), with the tree's kernel
# specs ("refs") and with a copy of kernels/ whose rmsnorm_bf16 and rope_cache_bf16 have no
# [tuning] reference ("norefs": a first call of each then waits until two configs agree).
# One untimed warm-up run, then ROUNDS rounds of the two, alternated. The in-process time
# (from the program's load to the synchronised result) and the process's wall time are printed.
# Usage (GPU machine): bench/gpu/first_call_ref_ab.sh [build dir]   (ROUNDS, default 3; results: $OUT/first_call_ref_ab.txt)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
ROUNDS=${ROUNDS:-3}
P=programs/decoder_llama3_8b.toml
K=$(mktemp -d /tmp/kiln-fc-ab-XXXXXX)
trap 'rm -rf "$K"' EXIT
cp -r kernels "$K/"
sed -i '/^reference = /d' "$K/kernels/cuda/rmsnorm_bf16.toml" "$K/kernels/cuda/rope_cache_bf16.toml"
once() {  # label kernels-dir
  local c t0 t1 s
  c=$(mktemp -d /tmp/kiln-fc-cache-XXXXXX)
  t0=$(date +%s.%N)
  s=$(KILN_CACHE_DIR=$c timeout 120 "$B/kiln" -q run --first-only "$2/$P" --set T=1 --set S=1024 --set CAP=1025 2>/dev/null)
  t1=$(date +%s.%N)
  rm -rf "$c"
  printf '%-7s %s (process %.2f s)\n' "$1" "$s" "$(python3 -c "print($t1 - $t0)")"
}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  once warmup kernels > /dev/null
  for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then once refs kernels; once norefs "$K/kernels"; else once norefs "$K/kernels"; once refs kernels; fi
  done
} | tee "$OUTD/first_call_ref_ab.txt"
