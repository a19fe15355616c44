#!/usr/bin/env bash
# The planted-fault run of issue 10: the built-in cpu matmul (18 configs) at
# M = N = K = 128, with a null dereference planted in the 6 configs with
# BM == 32 and an endless loop in the 6 with BM == 128. Prints the time of
# tuning the 6 good configs alone, the time of tuning all 18 with the faults,
# and what each bad config was recorded as. Each run starts with an empty cache.
# Usage: bench/planted_faults.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
KILN=$PWD/$BUILD/kiln
work=$(mktemp -d /tmp/kiln-planted-XXXXXX)
trap 'rm -rf "$work"' EXIT
cp kernels/cpu/matmul.cpp "$work/matmul.cpp"
cat >> "$work/matmul.cpp" <<'SRC'

// The planted faults: BM == 32 dereferences null, BM == 128 never returns.
void matmul_planted(kiln::program_id pid, const float* A, const float* B, float* C,
                    int64_t M, int64_t N, int64_t K) {
#if BM == 32
  *static_cast<volatile int*>(nullptr) = 0;
#elif BM == 128
  for (volatile int i = 0;; i = i + 1) {}
#endif
  matmul(pid, A, B, C, M, N, K);
}
SRC
sed -e 's/^entry   = "matmul"/entry   = "matmul_planted"/' kernels/cpu/matmul.toml > "$work/planted.toml"
sed -e 's/^BM = \[32, 64, 128\]/BM = [64]/' "$work/planted.toml" > "$work/good.toml"
run() {  # spec, cache
  local t0 t1
  t0=$(date +%s.%N)
  KILN_CACHE_DIR="$2" "$KILN" tune --json "$1" --set M=128 --set N=128 --set K=128 > "$2.json"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
good=$(run "$work/good.toml" "$work/cache-good")
planted=$(run "$work/planted.toml" "$work/cache-planted")
python3 - "$work/cache-planted.json" "$good" "$planted" <<'PY'
import json, sys, collections
r = json.load(open(sys.argv[1]))
kinds = collections.Counter(c["result"] for c in r["configs"])
print(f"{'run':<34} {'seconds':>8}")
print(f"{'6 good configs alone':<34} {float(sys.argv[2]):8.2f}")
print(f"{'18 configs, 12 planted faults':<34} {float(sys.argv[3]):8.2f}")
print(f"planted - good: {float(sys.argv[3]) - float(sys.argv[2]):.2f} s (target: at most 15 s)")
print("results:", dict(kinds), " chose:", r["best"])
for c in r["configs"]:
    if c["result"] != "ok":
        print(f"  {json.dumps(c['params'])}: {c['result']}: {c['error'].splitlines()[0][:110]}")
PY
