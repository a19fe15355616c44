#!/usr/bin/env bash
# The decode GEMM family (kernels/cuda/gemm_decode.cu, bf16, plain epilogue) against the
# device's copy bandwidth (issue 26, item 4): a sweep of configs, each built standalone with
# bench/gpu/gemm_check.cu (16 builds at a time) and run with -b: every correctness shape of
# the check first (a config that fails one is reported, and its figures are not used), then
# weight bytes / time at eight decode shapes, back to back over a ring of weight copies
# larger than L2 and single calls after an L2 flush, cuBLAS timed the same way; the copy
# bandwidth is a 1 GiB device-to-device copy, 2N / t. The summary (decode_bandwidth.py) gives
# per shape the best config that passed, the default config and cuBLAS.
# Usage (GPU machine, repository root): bench/gpu/decode_bandwidth.sh   (results: $OUT/decode/summary.txt, every config's output in $OUT/decode.tgz)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTD=${OUT:-/tmp/kiln-gpu-out}/decode
mkdir -p "$OUTD"
BIN=$(mktemp -d /tmp/kiln-decode-XXXXXX)
configs=()
for ks in 1 2 4; do for mt in 1 2; do for rg in 1 2; do for w in 4 8; do for u in 1 2 4; do for pipe in 1 2; do for pf in 0 1; do
  [ $((pipe * u * (mt + 2 * rg))) -le 16 ] || continue
  [ "$mt" = 2 ] && [ "$rg" = 2 ] && continue
  configs+=("rg${rg}_w${w}_u${u}_mt${mt}_p${pipe}_pf${pf}_ks${ks} -DRG=$rg -DWARPS=$w -DUNROLL=$u -DMT=$mt -DPIPE=$pipe -DL2PF=$pf -DKSPLIT=$ks")
done; done; done; done; done; done; done
echo "${#configs[@]} configs; building" >&2
for c in "${configs[@]}"; do
  set -- $c; n=$1; shift
  echo "nvcc -O3 -std=c++17 -arch=sm_90 -o $BIN/$n bench/gpu/gemm_check.cu -lcublas -DDECODE=1 -DVEC=8 -DDT=0 -DEPI=0 $* 2> $OUTD/$n.build.txt || echo build failed: $n"
done | xargs -P 16 -I{} sh -c {}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$OUTD/machine.txt"
for c in "${configs[@]}"; do
  set -- $c; n=$1
  [ -x "$BIN/$n" ] && timeout 120 "$BIN/$n" -b > "$OUTD/$n.txt" 2>&1
done
python3 bench/gpu/decode_bandwidth.py "$OUTD" | tee "$OUTD/summary.txt"
# the per-config outputs travel as one archive
tar czf "$OUTD.tgz" -C "$OUTD" . && rm -f "$OUTD"/rg*
