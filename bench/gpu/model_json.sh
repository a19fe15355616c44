#!/usr/bin/env bash
# One run for the whole-model figures, exact: the attention and decoder GPU tests; the
# decoder layer at T = 1, S = 1024 under `kiln run --check` with a decode loop; the whole model
# (kernels/programs/model_llama3_8b.toml) at T = 1, S = 1024 through `kiln run --json` (call_ns:
# whole calls back to back between two events; the decode loop's), tuned in the first
# process, then KILN_PDL=0 and =1 from the same cache; PyTorch's torch.compile with CUDA graphs
# on the same model between them (bench/gpu/torch_model.py). Parts are skipped once DEADLINE
# seconds have passed. Usage (GPU machine): bench/gpu/model_json.sh [build dir]  (results under $OUT)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-json-cache}
DEADLINE=${DEADLINE:-560}
start=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - start))); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "== tests"
timeout ${TEST_TIMEOUT:-150} "$B/tests/kiln_tests" --gtest_filter="${TESTS:-AttentionTest.*Gpu*:DecoderTest.ADecodeLoop*}" \
  > "$OUTD/tests.log" 2>&1
echo "exit code $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK|Failure" "$OUTD/tests.log" | head -20
echo "== decoder layer, T = 1, S = 1024"
KILN_PDL=1 timeout $(left) "$B/kiln" -q run --check --loop S=1000 kernels/programs/decoder_llama3_8b.toml \
  --set T=1 --set S=1024 --set CAP=2025 > "$OUTD/layer.txt" 2>&1
echo "exit code $?"
grep -E "first call|back to back|decode loop|check|attention" "$OUTD/layer.txt" | grep -v "^kiln: warning"
M=kernels/programs/model_llama3_8b.toml
model() {
  local pdl=$1
  [ "$(left)" -gt 20 ] || { echo "-- out of time: kiln KILN_PDL=$pdl not run"; return; }
  local t0=$(date +%s) name=model_pdl${pdl}_$(date +%s)
  KILN_PDL=$pdl timeout $(left) "$B/kiln" -q run --json --loop S=200 --calls 50 "$M" --set T=1 --set S=1024 \
    --set CAP=1225 > "$OUTD/$name.json" 2> "$OUTD/$name.err"
  echo "-- kiln, KILN_PDL=$pdl: exit code $? after $(($(date +%s) - t0)) s"
  python3 - "$OUTD/$name.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
l = d["loop"]
print(f"first call {d['first_call_s']:.3f} s, tuned {d['tuned_s']:.1f} s; back to back {d['call_ns'] / 1e6:.4f} ms a call, "
      f"host {d['host_ns_per_call'] / 1e3:.1f} us; decode loop {l['call_ns'] / 1e6:.4f} ms a call, host "
      f"{l['host_ns_per_call'] / 1e3:.1f} us, graphs captured {l['graph_captures']}, updated {l['graph_updates']}")
steps = d["steps"]
att = [s for s in steps if "attention" in json.dumps(s)][:1]
print("an attention step:", json.dumps(att)[:300])
PY
}
echo "== whole model, T = 1, S = 1024"
model 1
if [ "$(left)" -gt 90 ]; then
  echo "== PyTorch (torch.compile, CUDA graphs)"
  TORCHINDUCTOR_CACHE_DIR=$(mktemp -d /tmp/kiln-inductor-XXXXXX) timeout $(($(left) - 40)) \
    python3 bench/gpu/torch_model.py --out "$OUTD/torch_model.json" --points 1,1024 --forms reduce-overhead \
    2> "$OUTD/torch_stderr.txt"
  echo "exit code $?"
fi
model 0
model 1
