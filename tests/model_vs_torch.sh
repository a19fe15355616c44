#!/usr/bin/env bash
# The cpu model (kernels/programs/model_cpu.toml: three decoder layers, the final norm and
# the output projection) over a prompt of 9 tokens, 5 more over that cache (the causal mask
# aligned bottom-right), then 4 decode steps whose cache length crosses 16 (a bucket's end),
# its logits at every call
# compared with PyTorch's float32 computation of the same model on the same weights
# (bench/gpu/torch_logits.py makes them from kiln's seeds, include/kiln/fill.hpp): an
# implementation that shares no code with kiln's kernels, its reference programs or its
# tests. The same two tools check the bf16 model on the GPU (bench/gpu/model_logits.sh).
# Usage: tests/model_vs_torch.sh PATH/TO/kiln_bench_model_logits
set -euo pipefail
tool=$1
src=$(cd "$(dirname "$0")/.." && pwd)
PY=${KILN_PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "model_vs_torch: PyTorch is missing for $PY (make deps installs python3-torch; KILN_PYTHON names another)" >&2
  exit 1
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
export KILN_CACHE_DIR=$d/cache KILN_FIRST_CALL=wait KILN_BENCH_BUDGET_MS=2
"$tool" "$src/kernels/programs/model_cpu.toml" --out "$d/logits" --prompt 9 --chunk 5 --steps 4 --seed 7
"$PY" "$src/bench/gpu/torch_logits.py" "$d/logits"
