#!/usr/bin/env bash
# Copies what the GPU scripts run, stripped, from build-gpu into
# build-gpu-carry (same layout), small enough to take to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf build-gpu-carry
mkdir -p build-gpu-carry/tests build-gpu-carry/bench
for f in kiln kiln-worker tests/kiln_tests bench/kiln_bench_cuda_dispatch bench/kiln_bench_first_call \
    bench/kiln_bench_many_first_calls bench/kiln_bench_model_logits bench/kiln_bench_context; do
  if [ -f "build-gpu/$f" ]; then strip -o "build-gpu-carry/$f" "build-gpu/$f"; fi
done
# XGBoost for the budgeted search, with what it needs that the GPU machine may lack.
mkdir -p build-gpu-carry/lib
# (awk reads the whole list: leaving early would end ldconfig with SIGPIPE, failing under pipefail.)
known=$(ldconfig -p)
for l in libxgboost.so.0 libdmlc.so.0 libgomp.so.1; do
  src=$(awk -v l="$l" '$1 == l && !found {print $NF; found = 1}' <<< "$known")
  if [ -n "$src" ]; then cp -L "$src" build-gpu-carry/lib/; fi
done
du -sh build-gpu-carry
