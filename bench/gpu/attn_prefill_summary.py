#!/usr/bin/env python3
"""The table of bench/gpu/attn_prefill.sh: attn_prefill_summary.py RESULTS_DIR

Per (T, S): the attention multi-kernel's prefill variants (kiln_T_S.json: variant 10, flash
attention with mma.sync; variant 11, with wgmma), each its tuned best, and PyTorch SDPA's
backends (torch.json), all single calls after an L2 flush, in us and TFLOP/s (causal: the
pairs (token, key) a token sees, 4 x 128 flops a pair and query head). Then each wgmma
config alone (wg_T_S.json), where the configs part ran.
"""
import glob
import json
import os
import sys

HQ, D = 32, 128


def flops(T, S):
    pairs = T * S + T * (T + 1) // 2  # token i sees S + i + 1 keys
    return 4.0 * D * HQ * pairs


def ns(v):
    return v.get("median_ns") or v.get("ns")


def main():
    d = sys.argv[1]
    peers = {}
    if os.path.exists(os.path.join(d, "torch.json")):
        t = json.load(open(os.path.join(d, "torch.json")))
        peers = {(r["T"], r["S"]): r for r in t["rows"]}
    if os.path.exists(os.path.join(d, "machine.txt")):
        print("device:", open(os.path.join(d, "machine.txt")).read().strip())
    names = ["default", "flash", "cudnn", "efficient"]
    print(f"{'T':>6} {'S':>6} {'mma.sync':>9} {'wgmma':>9} {'chosen':>7} | " + " ".join(f"{n:>9}" for n in names)
          + f" | {'kiln TF/s':>9} {'vs fastest':>10} {'vs default':>10}")
    for p in sorted(glob.glob(os.path.join(d, "kiln_*.json")), key=lambda p: [int(x) for x in os.path.basename(p)[5:-5].split("_")]):
        T, S = (int(x) for x in os.path.basename(p)[5:-5].split("_"))
        try:
            k = json.load(open(p))
        except ValueError:
            continue
        by = {v.get("variant"): v for v in k.get("variants", []) if v.get("result") == "ok" and ns(v)}
        us = {i: ns(by[i]) / 1e3 for i in (10, 11) if i in by}
        if not by:
            continue
        best = min(by, key=lambda i: ns(by[i]))
        kus = ns(by[best]) / 1e3
        row = peers.get((T, S), {})
        cols, checked = [], {}
        for n in names:
            r = row.get(n, {})
            if isinstance(r, dict) and r.get("checked"):
                checked[n] = r["ms"] * 1e3
                cols.append(f"{r['ms'] * 1e3:9.1f}")
            else:
                cols.append(f"{'-':>9}")
        fast = min(checked.values()) if checked else None
        f = lambda x: f"{x:9.1f}" if x is not None else f"{'-':>9}"
        print(f"{T:>6} {S:>6} {f(us.get(10))} {f(us.get(11))} {best:>7} | " + " ".join(cols)
              + f" | {flops(T, S) / (kus * 1e-6) / 1e12:9.0f} "
              + (f"{fast / kus:9.2f}x" if fast else f"{'-':>10}") + " "
              + (f"{checked['default'] / kus:9.2f}x" if "default" in checked else f"{'-':>10}"))
    print("(us a call, single calls after an L2 flush; 'vs': the peer's time over kiln's, above 1 kiln is faster)")
    for p in sorted(glob.glob(os.path.join(d, "wg_*.json"))):
        T, S = (int(x) for x in os.path.basename(p)[3:-5].split("_"))
        try:
            k = json.load(open(p))
        except ValueError:
            continue
        line = []
        for r in k.get("configs", []):
            name = r.get("library") or " ".join(f"{a}={b}" for a, b in sorted((r.get("params") or {}).items()))
            if r.get("result") == "ok" and ns(r):
                line.append(f"{name}: {ns(r) / 1e3:.1f} us ({flops(T, S) / (ns(r) * 1e-9) / 1e12:.0f} TF/s)")
            elif r.get("result") != "pruned":
                line.append(f"{name}: {r.get('result')} {(r.get('error') or '')[:80]}")
        print(f"wgmma configs at T={T} S={S}: " + "; ".join(line))


if __name__ == "__main__":
    main()
