#!/usr/bin/env bash
# PTX of representative configs of the three GEMM families (every DT, BT, EPI; split and not),
# for checking that a refactor of kernels/cuda/gemm*.cu leaves the code alone:
#   bench/gpu/gemm_ptx_snapshot.sh before/ ; (edit) ; bench/gpu/gemm_ptx_snapshot.sh after/ ; then diff
# the files with register numbers normalised. Needs nvcc; no GPU.
out=$(realpath -m "$1"); mkdir -p "$out"; cd "$(dirname "$0")/../../kernels/cuda"
run() { name=$1; src=$2; shift 2; nvcc -ptx -std=c++17 -arch=sm_90a -I. "$@" $src -o $out/$name.ptx 2>$out/$name.err || echo "FAIL $name"; }
for dt in 0 1; do for bt in 0 1; do for epi in 0 1 2 3 4 5 6; do for split in 1 2; do
  run mma_${dt}_${bt}_${epi}_${split} gemm.cu -DDT=$dt -DBT=$bt -DEPI=$epi -DBM=128 -DBN=128 -DBK=32 -DWM=64 -DWN=64 -DSTAGES=3 -DSPLIT=$split -DGROUP_M=8 -DVEC=8 &
done; done; done; wait; done
for dt in 0 1; do for bt in 0 1; do for epi in 0 1 2 3 4 5 6; do for split in 1 2; do
  run wg_${dt}_${bt}_${epi}_${split} gemm_wgmma.cu -DDT=$dt -DBT=$bt -DEPI=$epi -DBM=128 -DBN=128 -DSTAGES=4 -DSPLIT=$split -DGROUP_M=8 -DMINB=1 &
done; done; wait; done; done
for dt in 0 1; do for epi in 0 2 6; do for ks in 1 2; do for vec in 1 8; do
  run dec_${dt}_${epi}_${ks}_${vec} gemm_decode.cu -DDT=$dt -DEPI=$epi -DRG=1 -DWARPS=4 -DUNROLL=2 -DKSPLIT=$ks -DMT=1 -DVEC=$vec &
done; done; wait; done; done
