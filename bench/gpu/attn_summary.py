#!/usr/bin/env python3
"""The table of bench/gpu/attn_decode.sh: attn_summary.py RESULTS_DIR

Per (T, S): kiln's fastest variant of attention_decode_bf16 (its `kiln tune --json`, single
calls after an L2 flush, checked against its first variant), PyTorch SDPA's fastest checked
backend timed the same way, both in us, and each one's cache read rate as a percentage of the
device-to-device copy bandwidth (torch.json's copy_GBps).
"""
import glob
import json
import os
import sys


def main():
    d = sys.argv[1]
    t = json.load(open(os.path.join(d, "torch.json")))
    copy = t["copy_GBps"]
    peers = {(r["T"], r["S"]): r for r in t["rows"]}
    print(f"copy bandwidth {copy:.0f} GB/s (2N / t, 1 GiB)")
    print(f"{'T':>3} {'S':>6} {'kiln us':>9} {'% copy':>7} {'variant':>8} {'SDPA us':>9} {'% copy':>7} {'backend':>9} {'kiln vs SDPA':>12}")
    for p in sorted(glob.glob(os.path.join(d, "kiln_*.json")), key=lambda p: [int(x) for x in os.path.basename(p)[5:-5].split("_")]):
        T, S = (int(x) for x in os.path.basename(p)[5:-5].split("_"))
        try:
            k = json.load(open(p))
        except ValueError:
            continue
        vs = [v for v in k.get("variants", []) if v.get("result") == "ok" and (v.get("median_ns") or v.get("ns"))]
        if not vs:
            continue
        ns = lambda v: v.get("median_ns") or v.get("ns")
        best = min(vs, key=ns)
        bytes_ = 2 * (S + T) * 8 * 128 * 2
        kus = ns(best) / 1e3
        row = peers.get((T, S), {})
        cands = [(r["ms"] * 1e3, n) for n, r in row.items() if isinstance(r, dict) and r.get("checked")]
        pus, pn = min(cands) if cands else (None, "-")
        pct = lambda us: 100 * bytes_ / (us * 1e-6) / 1e9 / copy
        print(f"{T:>3} {S:>6} {kus:9.1f} {pct(kus):7.1f} {best.get('variant', '?'):>8} "
              + (f"{pus:9.1f} {pct(pus):7.1f} {pn:>9} {pus / kus:11.2f}x" if pus else f"{'-':>9}"))


if __name__ == "__main__":
    main()
