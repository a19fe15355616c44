#!/usr/bin/env bash
# Writes N distinct small kernels (cpu or cuda) into a folder: kernel i
# computes y = x * i + 1 over n elements, 2 configs each (block sizes), so
# that each has its own source, binaries and tuning records.
# Usage: bench/first_call/make_kernels.sh cpu|cuda N DIR
set -euo pipefail
backend=$1 n=$2 dir=$3
mkdir -p "$dir"
for i in $(seq 1 "$n"); do
  if [ "$backend" = cpu ]; then
    cat > "$dir/k$i.cpp" <<SRC
void k$i(kiln::program_id pid, const float* x, float* y, int64_t n) {
  for (int64_t j = pid.x * BLOCK; j < (pid.x + 1) * BLOCK && j < n; ++j) y[j] = x[j] * $i.0f + 1.0f;
}
SRC
    cat > "$dir/k$i.toml" <<SPEC
name = "k$i"
backend = "cpu"
source = "k$i.cpp"
entry = "k$i"
grid = ["cdiv(n, BLOCK)"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
[params]
BLOCK = [1024, 4096]
[tuning]
key = ["n"]
SPEC
  else
    cat > "$dir/k$i.cu" <<SRC
extern "C" __global__ void k$i(const float* x, float* y, long long n) {
  long long j = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
  if (j < n) y[j] = x[j] * $i.0f + 1.0f;
}
SRC
    cat > "$dir/k$i.toml" <<SPEC
name = "k$i"
backend = "cuda"
source = "k$i.cu"
entry = "k$i"
grid = ["cdiv(n, BLOCK)"]
block = ["BLOCK"]
args = [ { name = "x", type = "f32*", size = "n", intent = "in" },
         { name = "y", type = "f32*", size = "n", intent = "out" },
         { name = "n", type = "i64" } ]
[params]
BLOCK = [128, 256]
[tuning]
key = ["n"]
SPEC
  fi
done
