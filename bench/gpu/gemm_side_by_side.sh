#!/usr/bin/env bash
# bf16 GEMMs on the GPU, kiln beside cuBLAS and torch.compile (issue 20):
#   kiln: `kiln tune` (library choices included: cuBLASLt's 8 ranked algorithms)
#   of the wgmma family (gemm_wgmma_bf16_nt), the mma.sync family (gemm_bf16_nt)
#   and, for M <= 16, the decode family; kiln's choice is the fastest of the
#   records' choices, as the multi-kernel over them (linear_bf16_nt.toml)
#   picks. Templates alone: the same records' best template; at the squares
#   4096 and 8192 an exhaustive templates-only tuning of the wgmma family.
#   The gated gate/up GEMM (gemm_bf16_nt_gated, and its decode form for T <= 16)
#   against eager silu(x Wg^T) * (x Wu^T).
#   PyTorch: bench/gpu/torch_gemm.py (torch.mm, torch.compile max-autotune-no-cudagraphs).
# Prints the table last (bench/gpu/gemm_summary.py). Results: $OUT/gemm.tgz.
# Usage (GPU machine): bench/gpu/gemm_side_by_side.sh [build dir] [parts: torch,wgmma,mma,decode,full,gated]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
PARTS=${2:-torch,wgmma,mma,decode,full,gated}
# Results gather in a folder of their own and travel back as one archive
# ($OUT/gemm.tgz, written again after every tuning, so a run cut short keeps
# what it did) with the summary beside it.
R=$(mktemp -d /tmp/kiln-gemm-res-XXXXXX)
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-gemm-XXXXXX)}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
H=4096; I=14336
pack() { tar czf "$OUTD/gemm.tgz" -C "$R" .; }
tune() {  # out spec M N K [flags]
  local out=$1 spec=$2 m=$3 n=$4 k=$5; shift 5
  "$B/kiln" -q tune --json "$spec" --set M=$m --set N=$n --set K=$k "$@" > "$R/$out.json" 2>> "$R/stderr.txt" ||
    echo "tune $out failed: $(tail -2 "$R/stderr.txt")"
  pack
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$R/machine.txt"
if has torch; then
  python3 bench/gpu/torch_gemm.py --out "$R/torch.json" 2>> "$R/stderr.txt" | tail -4
  pack
fi
shapes="square 1024 1024 1024
square 4096 4096 4096
square 8192 8192 8192"
for t in 1 8 64 256 1024 4096; do shapes="$shapes
up $t $I $H
down $t $H $I"; done
while read -r kind m n k; do
  t0=$(date +%s)
  has wgmma && tune "wgmma_${kind}_${m}_${n}_${k}" kernels/cuda/gemm_wgmma.toml:bf16_nt $m $n $k
  # mma.sync (about half of cuBLAS's rate on an H100): only where tiles are few
  has mma && [ "$m" -le 256 ] && tune "kiln_${kind}_${m}_${n}_${k}" kernels/cuda/gemm.toml:bf16_nt $m $n $k
  has decode && [ "$m" -le 16 ] && tune "decode_${kind}_${m}_${n}_${k}" kernels/cuda/gemm_decode.toml:bf16_nt $m $n $k
  echo "$kind $m x $n x $k: $(( $(date +%s) - t0 )) s"
done <<< "$shapes"
if has full; then
  for n in 4096 8192; do tune "full_square_$n" kernels/cuda/gemm_wgmma.toml:bf16_nt $n $n $n --effort full --no-library; done
fi
if has gated; then
  for t in 1 8 64 256 1024 4096; do
    tune "gated_wgmma_$t" kernels/cuda/gemm_wgmma.toml:bf16_nt_gated $t $I $H
    [ "$t" -le 16 ] && tune "gated_decode_$t" kernels/cuda/gemm_decode.toml:bf16_nt_gated $t $I $H
  done
fi
# Results from an earlier part (another run) join this one's: GEMM_EARLIER=folder.
[ -n "${GEMM_EARLIER:-}" ] && cp -n "$GEMM_EARLIER"/*.json "$R/" 2>/dev/null
python3 bench/gpu/gemm_summary.py "$R" | tee "$R/summary.txt" "$OUTD/gemm_summary.txt"
pack
