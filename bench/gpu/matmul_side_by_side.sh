#!/usr/bin/env bash
# fp32 matmul on the GPU, kiln beside cuBLAS and PyTorch Inductor:
#   1. M = N = K in {64, 256, 1024, 4096}: kiln tuned at one hint (64, 256,
#      4096) and kiln's size-hint multi-kernel (`kiln demo --backend cuda`),
#      cuBLAS, and Inductor (torch.compile dynamic=True, max-autotune, TF32
#      off; one hint per row, and multi-kernel hints 64, 256, 4096): ms, and
#      kiln / cuBLAS and Inductor / cuBLAS;
#   2. time to the first launch of a fresh process, cold (empty caches) and
#      warm, for kiln and for Inductor (M = N = K = 1024);
#   3. templates only (library choices off) at 4096 and 1024, for both
#      (Inductor's from its own autotuning log: its best Triton template
#      against its aten choice);
#   and, for kiln, tunings of shapes that are not squares or multiples of
#   the tiles. Prints a short table last.
#
# Usage (on the GPU machine, with build-gpu-carry from scripts/gpu-carry.sh):
#   bench/gpu/matmul_side_by_side.sh [build dir] [all|kiln|inductor|tests] [earlier results folder]
# A part alone fits a 10-minute limit where `all` does not; the summary
# then merges the results of an earlier part from the folder named last.
# Results go to $OUT/matmul (also packed as $OUT/matmul.tgz).
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
PART=${2:-all}
EARLIER=${3:-}
R=${OUT:-/tmp/kiln-gpu-out}/matmul
mkdir -p "$R"
work=$(mktemp -d /tmp/kiln-mm-XXXXXX)
trap 'rm -rf "$work"' EXIT
export KILN_KERNELS_DIR=$PWD/kernels
n1=1024
pack() { tar czf "$R/../matmul.tgz" -C "$R" . 2>/dev/null; }
has() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }

echo "== the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$R/machine.txt"
missing=$(ldd "$B/kiln" "$B/kiln-worker" | grep "not found" || true)
[ -n "$missing" ] && { echo "missing libraries: $missing"; exit 1; }
"$B/kiln" --version

if has tests; then
  echo "== GPU matmul tests"
  "$B/tests/kiln_tests" --gtest_filter='CudaTest.*' > "$R/tests.log" 2>&1
  grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) |Failure" "$R/tests.log" | head -20
  pack
fi

if has kiln; then
  echo "== kiln demo --backend cuda"
  KILN_CACHE_DIR=$work/demo-cache "$B/kiln" -q demo --backend cuda --json "$R/kiln_demo.json" > "$R/kiln_demo.txt" 2>&1
  echo "exit $?"; tail -30 "$R/kiln_demo.txt"
  pack

  echo "== kiln tune on shapes that are not squares or multiples of the tiles"
  for shape in "64 64 16384" "4096 64 4096" "1000 333 77" "2048 1536 1000" "96 4096 1024"; do
    set -- $shape
    t0=$(date +%s.%N)
    KILN_CACHE_DIR=$work/demo-cache "$B/kiln" -q tune --json kernels/cuda/matmul.toml \
      --set M=$1 --set N=$2 --set K=$3 > "$R/tune_$1_$2_$3.json" 2>> "$R/tune.err" ||
      { echo "tune $shape failed:"; tail -5 "$R/tune.err"; }
    echo "$shape: $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
    pack
  done

  echo "== kiln: first launch in a fresh process (matmul, M = N = K = $n1)"
  for mode in kernel size-hint; do
    flag=""; [ $mode = size-hint ] && flag=--size-hint
    cache=$work/first-$mode
    c=$(KILN_CACHE_DIR=$cache "$B/bench/kiln_bench_first_call" kernels/cuda/matmul.toml $flag --set M=$n1 --set N=$n1 --set K=$n1)
    w=$(KILN_CACHE_DIR=$cache "$B/bench/kiln_bench_first_call" kernels/cuda/matmul.toml $flag --set M=$n1 --set N=$n1 --set K=$n1)
    echo "$mode cold: $c; warm: $w"
    echo "{\"cold\": \"$c\", \"warm\": \"$w\"}" > "$R/kiln_first_$mode.json"
    pack
  done
fi

if has inductor; then
  echo "== Inductor: the hint x size table"
  TORCHINDUCTOR_CACHE_DIR=$work/inductor-table python3 bench/gpu/inductor_matmul.py table \
    --json "$R/inductor.json" > "$R/inductor.log" 2>&1
  echo "exit $?"; grep -E "^(ms|cuBLAS|Inductor|largest)" "$R/inductor.log"
  pack

  echo "== Inductor: first launch in a fresh process (M = N = K = $n1)"
  cache=$work/inductor-first
  TORCHINDUCTOR_CACHE_DIR=$cache python3 bench/gpu/inductor_matmul.py first --n $n1 --out "$R/inductor_first_cold.json" \
    > "$R/inductor_first.log" 2>&1
  TORCHINDUCTOR_CACHE_DIR=$cache python3 bench/gpu/inductor_matmul.py first --n $n1 --out "$R/inductor_first_warm.json" \
    >> "$R/inductor_first.log" 2>&1
  grep "^first launch" "$R/inductor_first.log"
  pack
fi

echo
echo "== summary"
python3 bench/gpu/matmul_summary.py "$R" $EARLIER
