#!/usr/bin/env bash
# Tunes a spec at one shape twice, in isolated workers (the default) and in
# this process (KILN_TUNE_IN_PROCESS=1), each with an empty cache, and prints
# the fastest configs of each side by side: a check that the two timing paths
# agree. Usage: bench/gpu/tune_isolated_vs_in_process.sh BUILD SPEC --set NAME=V ...
set -uo pipefail
cd "$(dirname "$0")/../.."
B=$1; spec=$2; shift 2
work=$(mktemp -d /tmp/kiln-iso-XXXXXX)
trap 'rm -rf "$work"' EXIT
KILN_CACHE_DIR=$work/a "$B/kiln" -q tune --json "$spec" "$@" > "$work/iso.json"
KILN_CACHE_DIR=$work/b KILN_TUNE_IN_PROCESS=1 "$B/kiln" -q tune --json "$spec" "$@" > "$work/inp.json"
python3 - "$work/iso.json" "$work/inp.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
def name(c):
    p = c["params"]
    return p.get("library") or " ".join(f"{k}={v}" for k, v in p.items())
tb = {name(c): c["ns"] for c in b["configs"]}
rows = sorted((c for c in a["configs"] if c["ns"]), key=lambda c: c["ns"])
print(f"{a['kernel']} {a['key']}: isolated chose {a['best']}, in-process chose {b['best']}")
print(f"{'config':<70} {'isolated us':>12} {'in-process us':>14}")
for c in rows[:8] + [c for c in rows[8:] if c["params"].get("library")]:
    other = tb.get(name(c))
    print(f"{name(c)[:70]:<70} {c['ns'] / 1e3:>12.2f} {(other or 0) / 1e3:>14.2f}")
PY
