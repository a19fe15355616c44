#!/usr/bin/env bash
# The GEMM handles' forms of several launches on the GPU (issue 26, items 2 and 3),
# each multi-kernel tuned by `kiln tune SPEC` on seeded random inputs: every
# variant tuned (each launch of a variant of several on its own), then the
# variants timed against each other in interleaved rounds, single calls after
# an L2 flush (kiln's default), their outputs checked against each other.
#   gated:      mlp_gate_up_bf16 (fused wgmma, decode, and the unfused form:
#               two GEMMs then SiLU·mul) at T tokens, Llama-3-8B (N 14336, K 4096),
#               and a shape tuned nowhere before (N 18944, K 3584);
#   residual:   linear_residual_bf16_nt (fused, and GEMM then + R) at T, N 4096, K 14336;
#   misaligned: linear_bf16_nt at shapes whose K is not a multiple of 8 (the padded
#               form: A and B copied to K' = cdiv(K, 8) * 8, then wgmma), with the
#               stored records of the families (cuBLASLt's choices among them) and a
#               tuning of the wgmma family at the aligned K' next to each;
#   torch:      bench/gpu/torch_forms.py, PyTorch timed the same way (and back to back);
#   tests:      the GPU test of these forms against a host reference.
# With KILN_BENCH_NO_L2_FLUSH=1 in the environment (and an empty KILN_CACHE_DIR), kiln's
# variants are timed without the flush instead: runs one after another with a warm L2
# (graph replays of many runs where one lasts under 20 us).
# Prints the table last (bench/gpu/forms_summary.py). Results: $OUT/forms.tgz.
# Usage (GPU machine): bench/gpu/forms.sh [build dir] [parts: tests,torch,gated,residual,misaligned]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
PARTS=${2:-tests,torch,gated,residual,misaligned}
R=$(mktemp -d /tmp/kiln-forms-res-XXXXXX)
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-forms-XXXXXX)}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
pack() { tar czf "$OUTD/forms.tgz" -C "$R" .; }
TS=${TS:-1,16,64,256,1024,2048,4096,8192}
TS_NEW=${TS_NEW:-5,200,3000}
MIS=${MIS:-"4096,4096,4100;2048,14336,4095;8192,4096,1027;1024,11008,4097;777,4096,14337;8,4096,4100"}
tune() {  # out spec M N K
  local out=$1 spec=$2
  "$B/kiln" -q tune --json "$spec" --set M=$3 --set N=$4 --set K=$5 > "$R/$out.json" 2>> "$R/stderr.txt" ||
    echo "tune $out failed: $(tail -2 "$R/stderr.txt")"
  pack
}
report() {  # out spec M N K
  "$B/kiln" -q report --json "$2" --set M=$3 --set N=$4 --set K=$5 > "$R/$1.json" 2>> "$R/stderr.txt"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$R/machine.txt"
# How kiln timed its variants, for the summary to compare PyTorch timed the same way.
if [ -n "${KILN_BENCH_NO_L2_FLUSH:-}" ] && [ "${KILN_BENCH_NO_L2_FLUSH}" != 0 ]; then echo warm > "$R/kiln_timing.txt"
else echo flush > "$R/kiln_timing.txt"; fi
if has tests; then
  timeout 300 "$B/tests/kiln_tests" --gtest_filter='CudaTest.TheGemmHandlesFormsOfSeveralLaunches*:MultiTest.*' \
    > "$R/tests.log" 2>&1
  echo "tests: exit code $?"; grep -E "^\[  (PASSED|FAILED)  \]|^\[  SKIPPED \]" "$R/tests.log"
fi
if has torch; then
  timeout 400 python3 bench/gpu/torch_forms.py --ts "$TS" --gated 14336,4096 --misaligned "$MIS" --compile \
    --out "$R/torch.json" 2>> "$R/stderr.txt" | tail -20
  pack
fi
if has gated; then
  for t in ${TS//,/ }; do t0=$(date +%s); tune "gated_${t}_14336_4096" kernels/cuda/mlp_gate_up_bf16.toml $t 14336 4096
    echo "gated T=$t: $(( $(date +%s) - t0 )) s"; done
  for t in ${TS_NEW//,/ }; do tune "gated_${t}_18944_3584" kernels/cuda/mlp_gate_up_bf16.toml $t 18944 3584; done
fi
if has residual; then
  for t in 1 256 4096; do tune "residual_${t}_4096_14336" kernels/cuda/linear_residual_bf16_nt.toml $t 4096 14336; done
fi
if has misaligned; then
  IFS=';' read -ra shapes <<< "$MIS"
  for s in "${shapes[@]}"; do
    IFS=',' read -r m n k <<< "$s"; ka=$(( (k + 7) / 8 * 8 )); t0=$(date +%s)
    tune "mis_${m}_${n}_${k}" kernels/cuda/linear_bf16_nt.toml $m $n $k
    report "rec_wgmma_${m}_${n}_${k}" kernels/cuda/gemm_wgmma.toml:bf16_nt $m $n $k
    report "rec_mma_${m}_${n}_${k}" kernels/cuda/gemm.toml:bf16_nt $m $n $k
    tune "aligned_${m}_${n}_${ka}" kernels/cuda/gemm_wgmma.toml:bf16_nt $m $n $ka
    echo "misaligned $m x $n x $k: $(( $(date +%s) - t0 )) s"
  done
fi
python3 bench/gpu/forms_summary.py "$R" | tee "$R/summary.txt" "$OUTD/forms_summary.txt"
pack
