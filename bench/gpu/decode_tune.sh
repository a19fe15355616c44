#!/usr/bin/env bash
# kiln's own choice for decode GEMMs (issue 26, item 4): `kiln tune` of the decode family's
# plain member with cuBLASLt's ranked algorithms as choices, at shapes given as M:N:K, every
# timed config checked against the reference by the tuner. One line a shape: the best
# template config, its time, the best cuBLASLt algorithm's time (both timed by kiln's
# benchmarker, the same way), and the weight bytes / template time.
# Usage (GPU machine): bench/gpu/decode_tune.sh [build dir] M:N:K ...
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}; shift
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-dec-XXXXXX)}
OUTD=${OUT:-/tmp/kiln-gpu-out}/decode_tune
mkdir -p "$OUTD"
for s in "$@"; do
  IFS=: read -r M N K <<<"$s"
  timeout 300 "$B/kiln" -q tune kernels/cuda/gemm_decode.toml:bf16_nt --set M=$M --set N=$N --set K=$K --json \
    >"$OUTD/$M-$N-$K.json" 2>"$OUTD/$M-$N-$K.err"
  echo "rc=$?" >>"$OUTD/$M-$N-$K.err"
  python3 - "$OUTD/$M-$N-$K.json" "$M" "$N" "$K" <<'PY'
import collections, json, sys
f, M, N, K = sys.argv[1], *map(int, sys.argv[2:])
try:
    rec = json.load(open(f)); rec = rec.get("record", rec)
except Exception as e:
    print(f"{M}x{N}x{K}: no record ({e})"); sys.exit()
cs = rec.get("configs", [])
kinds = collections.Counter(c.get("result", "?") for c in cs)
tm = [c for c in cs if c.get("ns") and "library" not in c["params"]]
lib = [c for c in cs if c.get("ns") and "library" in c["params"]]
bt = min(tm, key=lambda c: c["ns"]) if tm else None
bl = min(lib, key=lambda c: c["ns"]) if lib else None
gbps = N * K * 2 / bt["ns"] if bt else 0
print(f"{M}x{N}x{K}: configs {dict(kinds)}; template {bt['ns']/1e3 if bt else 0:.2f} us ({gbps:.0f} GB/s) "
      f"{json.dumps(bt['params']) if bt else '-'}; cuBLASLt best {bl['ns']/1e3 if bl else 0:.2f} us "
      f"({bl['params']['library'] if bl else '-'}); template/cuBLASLt time {bt['ns']/bl['ns'] if bt and bl else 0:.3f}; "
      f"choice {json.dumps(rec.get('best'))}")
PY
done
