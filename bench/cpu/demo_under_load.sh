#!/usr/bin/env bash
# `kiln demo` (the main job) on a machine kept busy: two processes that spin
# without end run beside it for the whole demo, as another tenant or a second
# build would. For each run size, the oracle (the config the tuning chose at
# that size) against the fastest of every choice the demo times beside it
# (the hint points' configs, the size-hint pick, templates only, the library
# call): the ratio, and the worst over the sizes. Run it from a cold cache
# (the default: a fresh one) so that the tunings themselves run under load.
# Usage: bench/cpu/demo_under_load.sh [build dir] [extra kiln demo arguments]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
shift || true
work=$(mktemp -d /tmp/kiln-demo-load-XXXXXX)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for i in 1 2; do
  bash -c 'while :; do :; done' &
  pids+=($!)
done
echo "busy processes: ${pids[*]} (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
KILN_CACHE_DIR=$work/cache "$B/kiln" demo --json "$work/demo.json" "$@" > "$work/demo.txt" 2>&1 || {
  cat "$work/demo.txt"; exit 1; }
kill "${pids[@]}"
pids=()
grep -E "noisy|warning" "$work/demo.txt" | head -5 || true
python3 - "$work/demo.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
sizes = d["sizes"]
rows = []
worst = 0
print(f"{'size':>6} {'oracle ms':>10} {'best beside':>12} {'best is':<22} {'oracle/best':>11}")
for j, n in enumerate(sizes):
    cands = {"oracle": d["oracle"]["ms"][j], "size-hint pick": d["size_hint"]["ms"][j],
             "templates only": d["templates_only"]["ms"][j]}
    for h in d["hints"]:
        cands[f"hint {h['hint']}"] = h["ms"][j]
    if "ms" in d["library"]:
        cands["library"] = d["library"]["ms"][j]
    best_name = min(cands, key=cands.get)
    r = cands["oracle"] / cands[best_name]
    worst = max(worst, r)
    print(f"{n:>6} {cands['oracle']:>10.4f} {cands[best_name]:>12.4f} {best_name:<22} {r:>10.3f}x")
print(f"worst oracle / best timed beside it: {worst:.3f}x")
PY
