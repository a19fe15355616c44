#!/usr/bin/env python3
"""Prints the tables of bench/gpu/matmul_side_by_side.sh from the files it left in one
or more folders (the first that has a file wins).
Usage: matmul_summary.py FOLDER [FOLDER...]"""
import glob
import json
import math
import os
import sys

folders = [d for d in sys.argv[1:] if d]


def path(name):
    for d in folders:
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    return None


def load(name):
    p = path(name)
    return json.load(open(p)) if p else None


def autotune_stats(name):
    """Inductor's 'Autotune Choices Stats' lines of a log: {"MxK,KxN": stats}."""
    p, out = path(name), {}
    if not p:
        return out
    lines = open(p, errors="replace").read().splitlines()
    for i, l in enumerate(lines):
        if l.strip() == "Autotune Choices Stats:" and i + 2 < len(lines):
            try:
                st = json.loads(lines[i + 1])
            except ValueError:
                continue
            for l2 in lines[i + 2:i + 4]:
                if l2.startswith("AUTOTUNE mm("):
                    out[l2[len("AUTOTUNE mm("):].rstrip(")")] = st
    return out


def row(label, cells, w=10):
    print(f"{label:<34}" + "".join(f"{c:>{w}}" for c in cells))


def ms(x):
    return "-" if x is None else (f"{x:.4f}" if x < 1 else f"{x:.3f}")


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def geo(v):
    v = [x for x in v if x]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")


kd, ind = load("kiln_demo.json"), load("inductor.json")
sizes = (kd or ind or {}).get("sizes", [64, 256, 1024, 4096])
print(f"1. fp32 matmul at M = N = K, ms (median); device: {(kd or {}).get('device') or (ind or {}).get('device')}")
row("", [str(s) for s in sizes])
k_lib = None
if kd:
    for h in kd["hints"]:
        row(f"kiln tuned at {h['hint']}", [ms(x) for x in h["ms"]])
    row("kiln size-hint multi-kernel", [ms(x) for x in kd["size_hint"]["ms"]])
    row("kiln oracle (tuned at the size)", [ms(x) for x in kd["oracle"]["ms"]])
    if "ms" in kd["library"]:
        k_lib = kd["library"]["ms"]
        row("cuBLAS (timed by kiln)", [ms(x) for x in k_lib])
t_lib = None
if ind:
    rows = {r["label"]: r for r in ind["rows"]}
    t_lib = rows["cuBLAS (torch.mm)"]["ms"]
    for r in ind["rows"]:
        if r["label"].startswith("Inductor"):
            row(r["label"], [ms(x) for x in r["ms"]])
    row("cuBLAS (torch.mm, do_bench)", [ms(x) for x in t_lib])
if kd and k_lib:
    row("kiln size-hint / cuBLAS", [ratio(a, b) for a, b in zip(kd["size_hint"]["ms"], k_lib)])
    row("kiln oracle / cuBLAS", [ratio(a, b) for a, b in zip(kd["oracle"]["ms"], k_lib)])
    for h in kd["hints"]:
        row(f"kiln tuned at {h['hint']} / cuBLAS", [ratio(a, b) for a, b in zip(h["ms"], k_lib)])
if ind:
    for r in ind["rows"]:
        if r["label"].startswith("Inductor"):
            row(f"{r['label']} / cuBLAS", [ratio(a, b) for a, b in zip(r["ms"], t_lib)])
    print(f"Inductor's largest relative error against float64: {ind['max_rel_err']:.1e}")
if kd:
    print(f"kiln's check against a plain loop: max error {kd['check']['max_error']:.1e} "
          f"({'OK' if kd['check']['ok'] else 'WRONG'})")

print("\n2. time to the first launch in a fresh process, M = N = K = 1024, seconds")
row("", ["cold", "warm"])
for name, label in [("kiln_first_kernel.json", "kiln Kernel (tuned at the call)"),
                    ("kiln_first_size-hint.json", "kiln size-hint (3 hints)")]:
    f = load(name)
    if f:
        row(label, [(f.get("cold") or "-").split(" ")[0], (f.get("warm") or "-").split(" ")[0]])
c, w = load("inductor_first_cold.json"), load("inductor_first_warm.json")
if c or w:
    row("Inductor (tuned at the call)", [str((c or {}).get("seconds", "-")), str((w or {}).get("seconds", "-"))])
    print(f"(Inductor's figures leave out `import torch`, {(c or w)['import_seconds']:.1f} s; each is a fresh process)")
print("\n3. templates only (library choices off), tuned and run at the size: ms and / cuBLAS")
row("", ["4096", "1024"], 18)
if kd and k_lib:
    cells = []
    for n in (4096, 1024):
        if n in sizes:
            j = sizes.index(n)
            cells.append(f"{ms(kd['templates_only']['ms'][j])} ({ratio(kd['templates_only']['ms'][j], k_lib[j])})")
        else:
            cells.append("-")
    row("kiln templates", cells, 18)
stats = {**autotune_stats("inductor_first.log"), **autotune_stats("inductor.log")}
cells = []
for n in (4096, 1024):
    st = stats.get(f"{n}x{n}, {n}x{n}")
    if st and "best_triton_time" in st:  # aten won: its time is best_time
        cells.append(f"{st['best_triton_time']:.4f} ({st['best_triton_time'] / st['best_time']:.2f}x)")
    elif st:  # a Triton template won outright: no aten time beside it here
        cells.append(f"{st['best_time']:.4f} (<1x)")
    else:
        cells.append("-")
if stats:
    row("Inductor Triton templates", cells, 18)
    print("(Inductor's: from its own autotuning at that size, best Triton template / its aten mm)")
if kd:
    for n in (4096, 1024):
        if n in sizes:
            print(f"kiln's templates-only choice at {n}: {kd['templates_only']['config'][sizes.index(n)]}")

print("\n4. kiln tune on other shapes: the choice, and tuned / cuBLAS in the same tuning")
row("M x N x K", ["chose", "ms", "cuBLAS", "ratio", "failed"], 12)
seen = set()
tunes = []
for d in folders:
    for p in sorted(glob.glob(os.path.join(d, "tune_*.json"))):
        if os.path.basename(p) not in seen:
            seen.add(os.path.basename(p))
            tunes.append(p)
for p in tunes:
    shape = os.path.basename(p)[5:-5].replace("_", " x ")
    if os.path.getsize(p) == 0:
        row(shape, ["failed"], 12)
        continue
    try:
        r = json.load(open(p))
    except Exception:
        row(shape, ["error"], 12)
        continue
    lib = [c["ns"] for c in r["configs"] if c["params"].get("library") and c["ns"]]
    failed = sum(1 for c in r["configs"] if c["result"] not in ("ok", "chosen", "pruned", "unavailable"))
    best = r["best"] or {}
    chose = best.get("library") or ("SPLIT=%s" % best.get("SPLIT", 1))
    best_ms = r["best_ns"] / 1e6 if r["best_ns"] else None
    row(shape, [chose, ms(best_ms), ms(lib[0] / 1e6) if lib else "-", ratio(r["best_ns"], lib[0]) if lib else "-",
                str(failed)], 12)
    kinds = {}
    for c in r["configs"]:
        kinds[c["result"]] = kinds.get(c["result"], 0) + 1
    print(f"{'':<34}results: {kinds}; best {best}")
