#!/usr/bin/env bash
# The Llama-3-8B MLP block as a kiln program on the GPU, beside PyTorch
# (issue 21): kernels/programs/mlp_llama3_8b.toml through `kiln run` at each
# token count (device time per call, host time per call with graph replay,
# the memory plan), host time without graphs, the first call cold (empty
# caches), warm, and from a packed artifact; bench/gpu/torch_mlp.py for eager
# PyTorch, torch.compile and max-autotune on the same block. Prints the table
# last (bench/gpu/program_summary.py); results in $OUT/program.tgz.
# Usage (GPU machine): bench/gpu/program_mlp.sh [build dir] [tokens] [parts: torch,kiln]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
TOKENS=${2:-1,3,8,64,100,256,1024,2000,4096}
PARTS=${3:-torch,kiln}
R=$(mktemp -d /tmp/kiln-prog-res-XXXXXX)
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
pack() { tar czf "$OUTD/program.tgz" -C "$R" .; }
P=kernels/programs/mlp_llama3_8b.toml
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$R/machine.txt"
if has torch; then
  TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/kiln-inductor-XXXXXX) timeout ${TORCH_TIMEOUT:-1200} \
    python3 bench/gpu/torch_mlp.py --out "$R/torch.json" --tokens "$TOKENS" 2>> "$R/stderr.txt" | tail -12
  pack
fi
if has kiln; then
  export KILN_CACHE_DIR=$(mktemp -d /tmp/kiln-prog-cache-XXXXXX)
  first=1
  for t in ${TOKENS//,/ }; do
    t0=$(date +%s.%N)
    "$B/kiln" -q run --json "$P" --set T=$t --calls 100 > "$R/kiln_$t.json" 2>> "$R/stderr.txt" ||
      echo "kiln run T=$t failed: $(tail -3 "$R/stderr.txt")"
    [ $first = 1 ] && cp "$R/kiln_$t.json" "$R/kiln_cold.json" && first=0
    echo "kiln T=$t: $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
    pack
  done
  KILN_PROGRAM_GRAPHS=0 "$B/kiln" -q run --json "$P" --set T=64 --calls 100 > "$R/kiln_nographs_64.json" 2>> "$R/stderr.txt"
  "$B/kiln" -q run --json "$P" --set T=64 --calls 100 > "$R/kiln_warm_64.json" 2>> "$R/stderr.txt"
  # A warm first call as a whole process: started, the program loaded, the first call made, exited.
  for i in 1 2 3; do
    t0=$(date +%s.%N)
    line=$("$B/kiln" -q run --first-only "$P" --set T=64 2>> "$R/stderr.txt")
    echo "warm process T=64: $(python3 -c "print(round($(date +%s.%N) - $t0, 3))") s wall; $line" | tee -a "$R/warm_process.txt"
  done
  "$B/kiln" -q pack "$P" --set T=1,64 -o "$R/mlp.kiln" >> "$R/stderr.txt" 2>&1
  KILN_CACHE_DIR=$(mktemp -d /tmp/kiln-prog-empty-XXXXXX) KILN_ARTIFACT=$R/mlp.kiln \
    "$B/kiln" -q run --json "$P" --set T=64 --calls 100 > "$R/kiln_artifact_64.json" 2>> "$R/stderr.txt"
  rm -f "$R/mlp.kiln"
  "$B/bench/kiln_bench_cuda_dispatch" > "$R/dispatch.txt" 2>> "$R/stderr.txt"
  pack
fi
python3 bench/gpu/program_summary.py "$R" | tee "$R/summary.txt" "$OUTD/program_summary.txt"
pack
