#!/usr/bin/env bash
# Builds kiln for the GPU machine into build-gpu: portable binaries (fmt
# header-only, static libstdc++) that run there without this machine's
# shared libraries. The GPU machine needs only its driver and the CUDA
# toolkit's NVRTC. Usage: scripts/build-gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON -DKILN_PORTABLE=ON
cmake --build build-gpu -j "$(nproc)"
