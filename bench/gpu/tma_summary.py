#!/usr/bin/env python3
"""The table of bench/gpu/tma_vs_cublas.sh: tma_summary.py RESULTS_DIR

Per shape (M x N x K), from the TMA family's `kiln tune --json` record (and the wgmma
family's, where it was tuned too): the best of cuBLASLt's ranked algorithms timed in the same
tuning, in ms; then the best TMA template over it (below 1: the template is faster), among
the whole space ("all"), without the clusters and stream-K ("base": MC = 1, SK = 0), with
the clusters only ("+MC": SK = 0), with stream-K only ("+SK": MC = 1) and with the tile
widths that are multiples of 64 only ("w64": BN = 64, 128, 256); the wgmma family's best over
the same; their geometric means and worst.
"""
import glob
import json
import math
import os
import sys


def best(rec, library, keep=lambda p: True):
    ns = [c["ns"] for c in rec.get("configs", [])
          if c.get("ns") and ("library" in c["params"]) == library and (library or keep(c["params"]))]
    return min(ns) if ns else None


def config_of(rec):
    b = [c for c in rec.get("configs", []) if c.get("ns") and "library" not in c["params"]]
    if not b:
        return "-"
    c = min(b, key=lambda c: c["ns"])
    return " ".join(f"{k}={v}" for k, v in c["params"].items() if k != "GROUP_M")


COLUMNS = [
    ("all", lambda p: True),
    ("base", lambda p: p.get("MC", 1) == 1 and p.get("SK", 0) == 0),
    ("+MC", lambda p: p.get("SK", 0) == 0),
    ("+SK", lambda p: p.get("MC", 1) == 1),
    ("w64", lambda p: p.get("BN", 64) % 64 == 0),
]


def main():
    d = sys.argv[1]
    rows = []
    for p in sorted(glob.glob(os.path.join(d, "tma_*.json")), key=lambda p: [int(x) for x in os.path.basename(p)[4:-5].split("_")]):
        shape = os.path.basename(p)[4:-5]
        try:
            tma = json.load(open(p))
        except (OSError, ValueError):
            continue
        try:
            wg = json.load(open(os.path.join(d, f"wgmma_{shape}.json")))
        except (OSError, ValueError):
            wg = None
        lib = best(tma, True)
        t = [best(tma, False, keep) for _, keep in COLUMNS]
        if lib is None or t[0] is None:
            continue
        rows.append((shape.replace("_", " x "), lib, t, best(wg, False) if wg else None, config_of(tma)))
    head = " ".join(f"{n + '/lt':>8}" for n, _ in COLUMNS)
    print(f"{'M x N x K':>22} {'lt ms':>8} {'tma ms':>8} {head} {'wgmma/lt':>8}  best tma config")
    ratios = [[] for _ in COLUMNS]
    wr = []
    for shape, lib, t, w, cfg in rows:
        cells = []
        for i, x in enumerate(t):
            if x is None:
                cells.append(f"{'-':>8}")
            else:
                ratios[i].append(x / lib)
                cells.append(f"{x / lib:8.3f}")
        if w:
            wr.append(w / lib)
        print(f"{shape:>22} {lib/1e6:8.4f} {t[0]/1e6:8.4f} {' '.join(cells)} {(f'{w/lib:8.3f}' if w else f'{chr(45):>8}')}  {cfg}")
    g = lambda v: math.exp(sum(math.log(x) for x in v) / len(v))
    for (name, _), r in zip(COLUMNS, ratios):
        if r:
            print(f"tma {name} / cuBLASLt: geomean {g(r):.3f}, worst {max(r):.3f}, best {min(r):.3f} ({len(r)} shapes)")
    if wr:
        print(f"wgmma / cuBLASLt: geomean {g(wr):.3f}, worst {max(wr):.3f} ({len(wr)} shapes)")


if __name__ == "__main__":
    main()
