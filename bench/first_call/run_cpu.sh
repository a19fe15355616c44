#!/usr/bin/env bash
# The first call in a fresh process on the cpu backend (issue 19), as
# bench/gpu/first_call.sh measures it on a GPU: the floor (an empty kernel),
# the cpu matmul cold (KILN_FIRST_CALL=swap: a safe choice at once, the
# shape tuned behind it; with its library choice and templates only) and
# warm, the quick choice against an exhaustive tuning, and 100 distinct
# tuned kernels in one process. Times: whole process (started to exited),
# then what the bench prints (seconds from main(); kiln=: the handle and its
# first call alone).
# Usage: bench/first_call/run_cpu.sh [build dir]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
work=$(mktemp -d /tmp/kiln-fc-cpu-XXXXXX)
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
first() {
  local cache=$1; shift
  local t0 out
  t0=$(now)
  out=$(KILN_CACHE_DIR=$cache "$B/bench/kiln_bench_first_call" "$@" 2>/dev/null | tr '\n' ' ')
  echo "$(python3 -c "print(f'{$(now) - $t0:.3f}')") $out"
}
echo "floor cold: $(first $work/floor bench/kernels/empty.toml --wait-tuned --set n=1024)"
for i in 1 2 3; do echo "floor warm: $(first $work/floor bench/kernels/empty.toml --set n=1024)"; done
for shape in "300 200 500" "1000 1000 1000" "64 2048 777"; do
  set -- $shape
  for lib in "" --no-library; do
    c=$work/mm-$1-$2-$3$lib
    echo "matmul $shape ${lib:-with library} cold: $(first $c kernels/cpu/matmul.toml $lib --wait-tuned --set M=$1 --set N=$2 --set K=$3)"
    for i in 1 2; do echo "matmul $shape ${lib:-with library} warm: $(first $c kernels/cpu/matmul.toml $lib --set M=$1 --set N=$2 --set K=$3)"; done
  done
done
bench/first_call/make_kernels.sh cpu 100 "$work/many"
KILN_CACHE_DIR=$work/many-cache KILN_FIRST_CALL=wait "$B/bench/kiln_bench_many_first_calls" --set n=4096 "$work"/many/k*.toml > /dev/null
for i in 1 2 3; do
  t0=$(now)
  out=$(KILN_CACHE_DIR=$work/many-cache "$B/bench/kiln_bench_many_first_calls" --set n=4096 "$work"/many/k*.toml)
  echo "100 kernels warm: $(python3 -c "print(f'{$(now) - $t0:.3f}')") $out"
  echo "floor warm: $(first $work/floor bench/kernels/empty.toml --set n=1024)"
done
