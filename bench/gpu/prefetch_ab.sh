#!/usr/bin/env bash
# Does asking L2 for the O projection's weights while RoPE and attention run (they leave the
# memory nearly idle) make the decode step faster? The layer and the model as the repository
# wires them (.) against trees where kernels/programs/decoder_llama3_8b.toml has an
# l2_prefetch_bf16 step (kernels/cuda/l2_prefetch_bf16.toml) for w_o inserted:
#   pf-rope  all of w_o, after RoPE (before attention)
#   pf-qkv   all of w_o, after the QKV projection (before RoPE)
#   pf-half  the first half of w_o, after RoPE
# Only the program differs: every kernel's tuning is shared, so the choices are the same in
# every tree and only the step differs. Runs bench/gpu/ab_kernels.sh on those trees (the layer
# at T = 1, S = 1024 and 8192, the model at S = 1024, whole calls back to back; the prefetch
# trees' layer is checked after, with --check).
# Usage (GPU machine): bench/gpu/prefetch_ab.sh [build dir]   (results: $OUT/ab.tgz, $OUT/ab_summary.txt)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
W=$(mktemp -d /tmp/kiln-prefetch-XXXXXX)
make_tree() {  # make_tree NAME AFTER_STEP ELEMENTS
  mkdir -p "$W/$1" && cp -r kernels "$W/$1/"
  python3 - "$W/$1/kernels/programs/decoder_llama3_8b.toml" "$2" "$3" <<'PY'
import sys
path, after, n = sys.argv[1:]
s = open(path).read()
s = s.replace('[kernels]\n', '[kernels]\nprefetch  = "../cuda/l2_prefetch_bf16.toml"\n', 1)
step = f'[[steps]]\nlaunch = "{after}"\n'
at = s.index(step)
end = s.index('\n', s.index('args', at)) + 1
s = s[:end] + f'[[steps]]\nlaunch = "prefetch"\nargs   = ["w_o", "{n}"]\n' + s[end:]
open(path, 'w').write(s)
PY
}
make_tree pf-rope rope "H * HQ * 128"
make_tree pf-qkv qkv_proj "H * HQ * 128"
make_tree pf-half rope "H * HQ * 64"
for t in pf-rope pf-qkv pf-half; do
  grep -n -A2 '"prefetch"' "$W/$t/kernels/programs/decoder_llama3_8b.toml" | head -3
done
TREES=". $W/pf-rope $W/pf-qkv $W/pf-half" POINTS=${POINTS:-"1,1024 1,8192"} MODEL=${MODEL:-1} bash bench/gpu/ab_kernels.sh "$B"
for t in pf-rope pf-qkv pf-half; do  # each prefetch tree's layer against its reference (tuned by now)
  timeout 120 "$B/kiln" -q run --json --check "$W/$t/kernels/programs/decoder_llama3_8b.toml" --set T=1 --set S=1024 \
    --set CAP=1025 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin); print('$t: layer check', j.get('check', {}).get('ok'))" \
    | tee -a "$OUTD/ab_summary.txt"
done
rm -rf "$W"
