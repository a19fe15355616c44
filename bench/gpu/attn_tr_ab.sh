#!/usr/bin/env bash
# The tensor-core decode split's forms on one GPU in one run (kernels/cuda/attn_split.cu): TR = 0
# (the rows on the mma's m16 side), TR = 1 (the products transposed: the rows on the n8 side for
# T G <= 8, K and V through shared buffers) and TR = 2 (TR = 1's products with K and V loaded
# straight into registers; RB = 1 or 2 tiles in registers). First the GPU attention tests (every
# variant of the handle forced, and TR = 1 and 2 configs of the one-launch split alone, against
# float64); then `kiln tune --json` of the one-launch split and of the two-launch split's first
# kernel at T = 1 over long caches (every config timed as single calls after an L2 flush, each
# checked against the default TR = 0 config), summarised as the fastest config of each form;
# then the whole handle at those points (bench/gpu/attn_decode.sh: every variant, PyTorch's SDPA
# beside it).
# Usage (GPU machine): bench/gpu/attn_tr_ab.sh [build dir]   (results under $OUT)
#   SIZES (default "1024 8192 32768"): the cache lengths S at T = 1; TESTS=0 and HANDLE=0 leave out
#   the tests and the whole handle's timing
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the libraries in $B/lib
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-tr-XXXXXX)}
SIZES=${SIZES:-"1024 8192 32768"}
[ "${TESTS:-1}" = 1 ] && timeout 240 "$B/tests/kiln_tests" --gtest_filter='AttentionTest.*Gpu*:AttentionTest.TheTransposed*' 2>&1 |
  grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |Failure|want|error" | head -40 | tee "$OUTD/tests.log"
mkdir -p "$OUTD/tr"
for s in $SIZES; do
  timeout 240 "$B/kiln" -q tune --json --force --search exhaustive kernels/cuda/attn_split_cluster_bf16.toml --set T=1 --set S=$s \
    --set CAP=$((s + 1)) --set HQ=32 --set HKV=8 > "$OUTD/tr/cluster_$s.json" 2>> "$OUTD/tr/stderr.txt"
  chunk=$(( (s + 1 + 31) / 32 )); [ $chunk -lt 64 ] && chunk=64
  timeout 120 "$B/kiln" -q tune --json --force --search exhaustive kernels/cuda/attn_split_bf16.toml --set T=1 --set S=$s \
    --set CAP=$((s + 1)) --set HQ=32 --set HKV=8 --set CHUNK=$chunk > "$OUTD/tr/split_${s}_$chunk.json" 2>> "$OUTD/tr/stderr.txt"
done
python3 - "$OUTD/tr" <<'PY' | tee "$OUTD/tr_summary.txt"
import glob, json, os, sys
print("%-24s %-9s %10s  %s" % ("kernel, S", "TR, RB", "best us", "config (wrong or failed configs)"))
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try:
        j = json.load(open(f))
    except Exception as e:
        print(os.path.basename(f), "unreadable:", e); continue
    rows = j.get("configs") or []
    for tr, rb in ((0, 2), (1, 2), (2, 1), (2, 2)):
        mine = [r for r in rows if int(r["params"].get("TR", -1)) == tr and int(r["params"].get("RB", 2)) == rb]
        ok = [r for r in mine if r.get("ns") and r.get("result") == "ok"]
        bad = ["%s: %s" % (r["params"], r.get("result")) for r in mine if not (r.get("ns") and r.get("result") == "ok")]
        best = min(ok, key=lambda r: r["ns"]) if ok else None
        print("%-24s %-9s %10s  %s %s" % (os.path.basename(f)[:-5], "%d, %d" % (tr, rb), "%.2f" % (best["ns"] / 1e3) if best else "-",
                                        best["params"] if best else "-", bad[:3]))
    print("%-24s chosen %s, %s" % ("", j.get("best"), j.get("verdict")))
PY
[ "${HANDLE:-1}" = 1 ] && POINTS=$(for s in $SIZES; do printf '1,%s ' "$s"; done) OUT=$OUTD timeout 200 bash bench/gpu/attn_decode.sh "$B" | tail -8
