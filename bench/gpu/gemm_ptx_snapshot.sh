#!/usr/bin/env bash
# PTX of representative configs of the three GEMM families (every dtype, layout and epilogue;
# split and not), compiled with the problem's defines as kiln passes them (GemmProblem::defines),
# for checking that a refactor of kernels/cuda/gemm*.cu leaves the code alone:
#   bench/gpu/gemm_ptx_snapshot.sh before/ ; (edit) ; bench/gpu/gemm_ptx_snapshot.sh after/ ; then diff
# the files with register numbers normalised. Needs nvcc; no GPU.
out=$(realpath -m "$1"); mkdir -p "$out"; cd "$(dirname "$0")/../../kernels/cuda"
run() { name=$1; src=$2; shift 2; nvcc -ptx -std=c++17 -arch=sm_90a -I. "$@" $src -o $out/$name.ptx 2>$out/$name.err || echo "FAIL $name"; }
# The named constants (their values are kiln's business: a kernel compares names only) and a
# member's problem: dtype 0 bf16, 1 f16; layout 0 nn, 1 nt; epilogue 0-6 as listed.
CONSTS="-DGEMM_DTYPE_F32=1 -DGEMM_DTYPE_F64=2 -DGEMM_DTYPE_F16=3 -DGEMM_DTYPE_BF16=4 -DGEMM_LAYOUT_NN=1 -DGEMM_LAYOUT_NT=2 -DGEMM_EPI_NONE=1 -DGEMM_EPI_BIAS=2
  -DGEMM_EPI_RESIDUAL=3 -DGEMM_EPI_SILU=4 -DGEMM_EPI_GELU=5 -DGEMM_EPI_BIAS_GELU=6 -DGEMM_EPI_GATED=7 -DGEMM_RMSNORM=0"
DTS=(BF16 F16); LAYOUTS=(NN NT); EPIS=(NONE BIAS RESIDUAL SILU GELU BIAS_GELU GATED)
problem() { echo "$CONSTS -DGEMM_DTYPE=GEMM_DTYPE_${DTS[$1]} -DGEMM_LAYOUT=GEMM_LAYOUT_${LAYOUTS[$2]} -DGEMM_EPILOGUE=GEMM_EPI_${EPIS[$3]}"; }
for dt in 0 1; do for bt in 0 1; do for epi in 0 1 2 3 4 5 6; do for split in 1 2; do
  run mma_${dt}_${bt}_${epi}_${split} gemm.cu $(problem $dt $bt $epi) -DBM=128 -DBN=128 -DBK=32 -DWM=64 -DWN=64 -DSTAGES=3 -DSPLIT=$split -DGROUP_M=8 -DVEC=8 &
done; done; done; wait; done
for dt in 0 1; do for bt in 0 1; do for epi in 0 1 2 3 4 5 6; do for split in 1 2; do
  run wg_${dt}_${bt}_${epi}_${split} gemm_wgmma.cu $(problem $dt $bt $epi) -DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=$split -DGROUP_M=8 -DMINB=1 &
done; done; wait; done; done
for dt in 0 1; do for epi in 0 2 6; do for ks in 1 2; do for vec in 1 8; do
  run dec_${dt}_${epi}_${ks}_${vec} gemm_decode.cu $(problem $dt 1 $epi) -DRG=1 -DWARPS=4 -DUNROLL=2 -DKSPLIT=$ks -DMT=1 -DVEC=$vec -DPIPE=1 -DL2PF=0 &
done; done; wait; done; done
