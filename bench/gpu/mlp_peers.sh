#!/usr/bin/env bash
# The Llama-3-8B MLP block: kiln run against PyTorch eager and torch.compile
# (dynamic shapes), each with the weights as a linear layer stores them (out x
# in) and transposed (in x out), all timed the same way: whole calls back to
# back between two CUDA events (kiln run's "a call on the device"; torch_mlp.py's
# b2b). Each kiln run also checks its result (kiln run --check, 64 rows).
# Prints the table last (bench/gpu/mlp_peers_summary.py); results in $OUT/mlp.tgz.
# Usage (GPU machine): bench/gpu/mlp_peers.sh [build dir] [tokens]
#   KILN_TIMEOUT (200): seconds for each kiln run, its cold tuning included; TORCH_TIMEOUT (300)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
TOKENS=${2:-1,64,1024,4096,8192}
R=$(mktemp -d /tmp/kiln-mlp-res-XXXXXX)
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-mlp-cache-XXXXXX)}
pack() { tar czf "$OUTD/mlp.tgz" -C "$R" .; }
P=kernels/programs/mlp_llama3_8b.toml
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$R/machine.txt"
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/kiln-inductor-XXXXXX) timeout ${TORCH_TIMEOUT:-300} \
  python3 bench/gpu/torch_mlp.py --out "$R/torch.json" --tokens "$TOKENS" --forms eager,compile \
  --layouts out_in,in_out 2>> "$R/stderr.txt" | tail -8
pack
for t in ${TOKENS//,/ }; do
  t0=$(date +%s)
  timeout ${KILN_TIMEOUT:-200} "$B/kiln" -q run --json "$P" --set T=$t --calls 100 > "$R/kiln_$t.json" 2>> "$R/stderr.txt" ||
    echo "kiln run T=$t failed: $(tail -3 "$R/stderr.txt")"
  timeout 100 "$B/kiln" -q run "$P" --set T=$t --check --calls 3 --reps 1 > "$R/check_$t.txt" 2>&1
  echo "kiln T=$t: $(( $(date +%s) - t0 )) s; check exit code $?"
  pack
done
python3 bench/gpu/mlp_peers_summary.py "$R" | tee "$R/summary.txt" "$OUTD/mlp_summary.txt"
pack
