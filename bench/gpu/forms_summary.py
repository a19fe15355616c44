#!/usr/bin/env python3
"""The table of bench/gpu/forms.sh's results (a folder of its JSON files).
kiln's times are its multi-kernel's own (variants timed against each other in one
interleaved run, single calls after an L2 flush); PyTorch's are bench/gpu/torch_forms.py's,
timed the same way (flush) and back to back (b2b).
  forms_summary.py DIR"""
import glob
import json
import os
import sys


def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


def us(ns):
    return "-" if ns is None else f"{ns / 1e3:.1f}"


def variants(j):
    return {v["name"] + (" [unfused]" if v["launches"] > 1 else ""): v for v in j["variants"]}


def several(j):
    return [v for v in j["variants"] if v["launches"] > 1]


def chosen_ns(j):
    return j["variants"][j["variant"]]["ns"]


def main():
    d = sys.argv[1]
    torch = load(os.path.join(d, "torch.json")) or {"gated": [], "misaligned": []}
    # kiln's variants timed after a flush (default) or warm (KILN_BENCH_NO_L2_FLUSH=1): PyTorch the same way.
    warm = os.path.exists(os.path.join(d, "kiln_timing.txt")) and open(os.path.join(d, "kiln_timing.txt")).read().strip() == "warm"
    way = "b2b" if warm else "flush"
    print(f"kiln's variants timed: {'with a warm cache, runs one after another' if warm else 'single calls after an L2 flush'}; "
          f"PyTorch compared {way}")
    print(f"device: {open(os.path.join(d, 'machine.txt')).read().strip() if os.path.exists(os.path.join(d, 'machine.txt')) else '?'}")

    rows = sorted(glob.glob(os.path.join(d, "gated_*.json")),
                  key=lambda p: (int(p.split("_")[-2]), int(os.path.basename(p).split("_")[1])))
    if rows:
        print("\n## Gated gate/up: the handle's choice against its unfused form (kiln, same run) and PyTorch eager")
        print(f"| T | N x K | chosen | handle us | unfused form us | handle / unfused | fused (wgmma) us | torch eager fastest us (flush / b2b) | handle vs torch ({way}) | torch.compile us ({way}) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for p in rows:
            j = load(p)
            if not j:
                continue
            t = int(j["key"].split()[0].split("=")[1])
            n, k = (int(x.split("=")[1]) for x in j["key"].split()[1:3])
            unf = several(j)[0]
            fused = j["variants"][0]
            h = chosen_ns(j)
            tr = next((r for r in torch["gated"] if r["T"] == t and r["N"] == n and r["K"] == k), None)
            tf = tb = tc = None
            if tr:
                tf = tr[tr["fastest_eager_flush"]]["flush_us"]
                tb = tr[tr["fastest_eager_b2b"]]["b2b_us"]
                tc = tr.get("torch.compile", {}).get(f"{way}_us")
            print(f"| {t} | {n} x {k} | {j['name']} | {us(h)} | {us(unf['ns'])} | "
                  f"{(h / unf['ns']) if unf['ns'] else float('nan'):.3f} | {us(fused['ns'])} | "
                  f"{'-' if tf is None else f'{tf:.1f} / {tb:.1f}'} | "
                  f"{'-' if tf is None else f'{(tb if warm else tf) * 1e3 / h:.2f}x'} | {'-' if tc is None else f'{tc:.1f}'} |")

    rows = sorted(glob.glob(os.path.join(d, "residual_*.json")), key=lambda p: int(os.path.basename(p).split("_")[1]))
    if rows:
        print("\n## Residual: the handle's choice against its unfused form (GEMM, then + R)")
        print("| T | chosen | handle us | unfused us | handle / unfused |")
        print("|---|---|---|---|---|")
        for p in rows:
            j = load(p)
            if not j:
                continue
            unf = several(j)[0]
            h = chosen_ns(j)
            print(f"| {j['key']} | {j['name']} | {us(h)} | {us(unf['ns'])} | "
                  f"{(h / unf['ns']) if unf['ns'] else float('nan'):.3f} |")

    rows = sorted(glob.glob(os.path.join(d, "mis_*.json")))
    if rows:
        print("\n## K not a multiple of 8: linear_bf16_nt against cuBLASLt at the same shape and at the aligned K next to it")
        print("| M x N x K | chosen | kiln us | padded form us | cuBLASLt best here us | kiln / cuBLASLt here (speed-up) "
              "| cuBLASLt at K' us | cuBLASLt here / at K' (rate) | torch.mm here us (flush) | torch.mm at K' us |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for p in rows:
            j = load(p)
            if not j:
                continue
            m, n, k = (int(x) for x in os.path.basename(p)[4:-5].split("_"))
            ka = (k + 7) // 8 * 8
            lib = []
            for fam in ("wgmma", "mma"):
                r = load(os.path.join(d, f"rec_{fam}_{m}_{n}_{k}.json"))
                if r:
                    lib += [c["ns"] for c in r["configs"] if c["ns"] and "library" in c["params"]]
            al = load(os.path.join(d, f"aligned_{m}_{n}_{ka}.json"))
            lib_al = [c["ns"] for c in al["configs"] if c["ns"] and "library" in c["params"]] if al else []
            here = min(lib) if lib else None
            there = min(lib_al) if lib_al else None
            pad = several(j)[0]
            h = chosen_ns(j)
            tr = next((r for r in torch["misaligned"] if (r["M"], r["N"], r["K"]) == (m, n, k)), None)
            th = ta = None
            if tr:
                th = min(v["flush_us"] for kk, v in tr.items() if kk.startswith("misaligned:"))
                ta = min(v["flush_us"] for kk, v in tr.items() if kk.startswith("aligned:"))
            print(f"| {m} x {n} x {k} | {j['name']} | {us(h)} | {us(pad['ns'])} | {us(here)} | "
                  f"{'-' if not here else f'{here / h:.2f}x'} | {us(there)} | "
                  f"{'-' if not (here and there) else f'{there / here:.2f}'} | "
                  f"{'-' if th is None else f'{th:.1f}'} | {'-' if ta is None else f'{ta:.1f}'} |")
            if pad["result"] != "ok":
                print(f"|   padded form: {pad['result']}: {(pad['error'] or '')[:160]} |")


if __name__ == "__main__":
    main()
