#!/usr/bin/env bash
# The RMSNorm in the decode GEMM (the rmsnorm members of kernels/cuda/gemm_decode.toml, the
# handles rmsnorm_linear_bf16_nt.toml and rmsnorm_mlp_gate_up_bf16.toml): the GPU tests of
# every config of the rmsnorm members and of the handles' forms against float64 references;
# then the whole model beside PyTorch at T = 1, S = 1024 (model_sweep.sh: kiln tunes in its
# process, then torch.compile with CUDA graphs); the layer's `kiln run --check` on the cache the
# model left (its records are the layer's); each kernel of the layer timed alone
# (layer_profile.sh). The programs run as kernels/programs wires them: to measure the handles
# in the layer, wire its norms through them (bench/gpu/results/issue28-rmsnorm-fused did).
# TESTS_TIMEOUT and DEADLINE (for model_sweep.sh) bound the parts.
# Usage (GPU machine): bench/gpu/rmsnorm_fused.sh [build dir]   (results under $OUT)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-rmsnorm-cache}
timeout "${TESTS_TIMEOUT:-120}" "$B/tests/kiln_tests" \
  --gtest_filter="${TESTS:-CudaTest.TheDecodeFamilysRmsNormMembersComputeTheirProblemAtEdgeShapes:CudaTest.TheGemmHandlesForms*}" > "$OUTD/tests.log" 2>&1
echo "tests: exit code $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure" "$OUTD/tests.log" | head -20
SWEEP=1024 DEADLINE=${DEADLINE:-330} bash bench/gpu/model_sweep.sh "$B" 2>&1 | tail -8
timeout 120 "$B/kiln" -q run --json --check kernels/programs/decoder_llama3_8b.toml --set T=1 --set S=1024 --set CAP=1025 \
  > "$OUTD/layer_check.json" 2> "$OUTD/layer_check.err"
echo "layer check: exit code $?"
python3 -c "import json; j=json.load(open('$OUTD/layer_check.json')); print('layer T=1 S=1024: call %.1f us, check %s' % (j['call_ns']/1e3, j.get('check', {}).get('ok')))
for s in j['steps']: print('  %8.1f us  %s' % (s['ns']/1e3, s['choice']))"
timeout 60 bash bench/gpu/layer_profile.sh "$B" > /dev/null 2>&1
tail -10 "$OUTD/profile/summary.txt" 2>/dev/null
tar czf "$OUTD/profile.tgz" -C "$OUTD" profile && rm -rf "$OUTD/profile"
records_out  # $OUTD/records.tgz: the model's and the layer's records (bench/gpu/env.sh)
