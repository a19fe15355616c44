#!/usr/bin/env bash
# The cuda backend on a GPU, in one go (issue 11): the machine, `kiln
# backends`, the GPU tests (launch, tune on real device buffers, planted
# faults), the dispatch benchmark against raw cuLaunchKernel, the first call
# of the softmax multi-kernel in a fresh process (cold, then warm), the
# planted-fault tuning from the command line, and a tuning's peak extra
# device memory. Prints a short table last.
# Usage (on the GPU machine, after scripts/build-gpu.sh here): bench/gpu/run_cuda.sh [build dir]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu}
OUTDIR=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTDIR"
work=$(mktemp -d /tmp/kiln-gpu-XXXXXX)
export KILN_CACHE_DIR=$work/cache
now() { date +%s.%N; }

echo "== the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
missing=$(ldd "$B/kiln" "$B/kiln-worker" | grep "not found" || true)
[ -n "$missing" ] && { echo "missing libraries: $missing"; exit 1; }
"$B/kiln" --version

echo "== kiln backends"
"$B/kiln" backends | tee "$OUTDIR/backends.txt"

echo "== the GPU tests"
"$B/tests/kiln_tests" --gtest_filter='Cuda*' 2>&1 | tee "$OUTDIR/tests.log" | grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |NOTE|Failure" | head -40
tests_failed=$(grep -cE "^\[  FAILED  \] Cuda.*\([0-9]+ ms\)" "$OUTDIR/tests.log" || true)

echo "== dispatch: host time per launch"
"$B/bench/kiln_bench_cuda_dispatch" | tee "$OUTDIR/dispatch.txt"

echo "== first call of the softmax multi-kernel in a fresh process (M=4096, N=1024)"
cold=$("$B/bench/kiln_bench_first_call" kernels/cuda/softmax_multi.toml --set M=4096 --set N=1024)
warm=$("$B/bench/kiln_bench_first_call" kernels/cuda/softmax_multi.toml --set M=4096 --set N=1024)
echo "cold: $cold"
echo "warm: $warm"

echo "== planted faults, from the command line"
t0=$(now)
"$B/kiln" tune bench/gpu/planted/planted.toml --set n=1000000 | tee "$OUTDIR/planted.txt"
t1=$(now)
planted_s=$(python3 -c "print($t1 - $t0)")

echo "== a tuning's extra device memory (axpy, n = 2^26: 3 buffers of 256 MiB)"
"$B/kiln" tune --json kernels/cuda/axpy.toml --set n=67108864 --set alpha=2 > "$OUTDIR/axpy.json"
python3 - "$OUTDIR/axpy.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"chose {r['best']}: {r['best_ns']/1e3:.1f} us; peak extra device memory {r['peak_extra_device_bytes']/2**20:.0f} MiB")
PY

echo
echo "== summary"
python3 - "$OUTDIR" "$cold" "$warm" "$planted_s" "$tests_failed" <<'PY'
import json, sys, re
out, cold, warm, planted_s, failed = sys.argv[1:6]
rows = [l for l in open(f"{out}/dispatch.txt") if re.match(r"^(raw|Loaded|Kernel|SizeHint|Multi)", l)]
print(f"{'what':<40} {'figure':>28}")
for l in rows:
    parts = l.split()
    name = " ".join(parts[:-2])
    print(f"{'dispatch ' + name:<40} {parts[-2] + ' ns (+' + parts[-1] + ')':>28}")
print(f"{'softmax first call, cold':<40} {cold.split()[0] + ' s':>28}")
print(f"{'softmax first call, warm':<40} {warm.split()[0] + ' s':>28}")
print(f"{'planted-fault tuning (5 configs, 3 bad)':<40} {float(planted_s):>26.2f} s")
r = json.load(open(f"{out}/axpy.json"))
print(f"{'axpy tuning, peak extra device memory':<40} {r['peak_extra_device_bytes']/2**20:>24.0f} MiB")
print(f"{'GPU tests failed':<40} {failed:>28}")
PY
rm -rf "$work"
