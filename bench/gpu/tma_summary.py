#!/usr/bin/env python3
"""The table of bench/gpu/tma_vs_cublas.sh: tma_summary.py RESULTS_DIR

Per shape (M x N x K), from each family's `kiln tune --json` record: the best template of
the TMA family and of the wgmma family, and the best of cuBLASLt's ranked algorithms timed
in the same tuning (the TMA family's), in ms; then the ratios template / cuBLASLt (below 1:
the template is faster), their geometric mean and worst.
"""
import glob
import json
import math
import os
import sys


def best(rec, library):
    ns = [c["ns"] for c in rec.get("configs", []) if c.get("ns") and ("library" in c["params"]) == library]
    return min(ns) if ns else None


def config_of(rec):
    b = [c for c in rec.get("configs", []) if c.get("ns") and "library" not in c["params"]]
    if not b:
        return "-"
    c = min(b, key=lambda c: c["ns"])
    return " ".join(f"{k}={v}" for k, v in c["params"].items() if k in ("BM", "BN", "STAGES", "MINB", "PINGPONG", "SPLIT"))


def main():
    d = sys.argv[1]
    rows = []
    for p in sorted(glob.glob(os.path.join(d, "tma_*.json")), key=lambda p: [int(x) for x in os.path.basename(p)[4:-5].split("_")]):
        shape = os.path.basename(p)[4:-5]
        try:
            tma = json.load(open(p))
            wg = json.load(open(os.path.join(d, f"wgmma_{shape}.json")))
        except (OSError, ValueError):
            continue
        t, w, lib = best(tma, False), best(wg, False), best(tma, True)
        lib_w = best(wg, True)
        if None in (t, w, lib):
            continue
        rows.append((shape.replace("_", " x "), t, w, lib, lib_w, config_of(tma)))
    print(f"{'M x N x K':>22} {'tma ms':>9} {'wgmma ms':>9} {'cublasLt':>9} {'tma/lt':>7} {'wgmma/lt':>8} {'best/lt':>7}  tma config")
    rt, rb = [], []
    for shape, t, w, lib, lib_w, cfg in rows:
        a, b = t / lib, min(t, w) / lib
        rt.append(a)
        rb.append(b)
        print(f"{shape:>22} {t/1e6:9.4f} {w/1e6:9.4f} {lib/1e6:9.4f} {a:7.3f} {w/lib:8.3f} {b:7.3f}  {cfg}"
              + (f"  (cuBLASLt in the wgmma tuning: {lib_w/1e6:.4f})" if lib_w else ""))
    if rt:
        g = lambda v: math.exp(sum(math.log(x) for x in v) / len(v))
        print(f"tma template / cuBLASLt: geomean {g(rt):.3f}, worst {max(rt):.3f}; "
              f"best template of either family / cuBLASLt: geomean {g(rb):.3f}, worst {max(rb):.3f} ({len(rt)} shapes)")


if __name__ == "__main__":
    main()
