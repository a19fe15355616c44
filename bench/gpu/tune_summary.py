# One line for a `kiln tune --json` run: the configs by kind of result and the choice,
# then each config that neither ran right nor was pruned. Shared by
# bench/gpu/kernels_check.sh and bench/gpu/families_check.sh.
# Usage: python3 bench/gpu/tune_summary.py SPEC SETS EXIT_CODE OUT.json ERR.txt
import collections
import json
import sys

spec, sets, rc, out, err = sys.argv[1:]
try:
    j = json.load(open(out))
except Exception:
    print(f"{spec} {sets}: rc={rc}, no JSON; stderr tail: {open(err).read()[-400:]}")
    sys.exit()
rec = j.get("record", j)
kinds = collections.Counter(c.get("result", "?") for c in rec.get("configs", []))
print(f"{spec} {sets}: rc={rc} configs by kind {dict(kinds)} best {rec.get('best')}")
for c in rec.get("configs", []):
    if c.get("result") not in ("ok", "pruned"):
        print("   ", c.get("result"), c.get("params"), (c.get("error") or "")[:160])
