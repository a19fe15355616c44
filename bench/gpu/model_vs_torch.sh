#!/usr/bin/env bash
# The whole Llama-3-8B model (no embedding lookup) at T = 1, S = 1024: PyTorch first
# (bench/gpu/torch_model.py: eager and torch.compile with CUDA graphs, whole calls back to
# back between two CUDA events), then kiln (kernels/programs/model_llama3_8b.toml through
# `kiln run`, whole calls back to back between two events; tuned in the first process, then
# KILN_PDL=0 and =1 from the same cache). Each part is skipped once DEADLINE seconds
# have passed (the machine's limit for one command).
# Usage (GPU machine): bench/gpu/model_vs_torch.sh [build dir]   (results under $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-pdl-cache}
DEADLINE=${DEADLINE:-560}
start=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - start))); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "== PyTorch"
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/kiln-inductor-XXXXXX) timeout ${TORCH_TIMEOUT:-240} \
  python3 bench/gpu/torch_model.py --out "$OUTD/torch_model.json" --points 1,1024 \
  --forms ${FORMS:-eager,reduce-overhead} 2> "$OUTD/torch_stderr.txt"
echo "exit code $?"
M=kernels/programs/model_llama3_8b.toml
ML=${MODEL_LOOP:-200}
for pdl in 1 0 1; do
  [ "$(left)" -gt 20 ] || { echo "-- out of time: KILN_PDL=$pdl not run"; continue; }
  t0=$(date +%s)
  name=model_pdl${pdl}_$t0
  KILN_PDL=$pdl timeout $(left) "$B/kiln" -q run --loop S=$ML --calls 50 "$M" --set T=1 --set S=1024 \
    --set CAP=$((1025 + ML)) > "$OUTD/$name.txt" 2>&1
  echo "-- kiln, KILN_PDL=$pdl: exit code $? after $(($(date +%s) - t0)) s"
  grep -E "first call|back to back|decode loop" "$OUTD/$name.txt"
done
