# Every config a `kiln tune --json` run timed, fastest first, with its time against the
# fastest config of a baseline form (BASE="NAME=VALUE": the configs with that param value).
# Usage: python3 bench/gpu/tune_times.py OUT.json [BASE]
import json
import sys

j = json.load(open(sys.argv[1]))
rec = j.get("record", j)
base = sys.argv[2] if len(sys.argv) > 2 else ""
ok = [c for c in rec.get("configs", []) if c.get("result") == "ok" and c.get("ns")]
ok.sort(key=lambda c: c["ns"])
bk, bv = base.split("=") if base else ("", "")
bt = min((c["ns"] for c in ok if str(c["params"].get(bk)) == bv), default=None)
for c in ok:
    p = " ".join(f"{k}={v}" for k, v in c["params"].items())
    rel = f"  {bt / c['ns']:.3f}x the fastest {base}" if bt else ""
    print(f"   {c['ns'] / 1e3:9.2f} us  {p}{rel}")
