#!/usr/bin/env python3
"""The whole model's figures from one bench/gpu/model_sweep.sh run: model_sweep_summary.py DIR

DIR holds kiln_S<S>.json (a decode step, T = 1) and kiln_T<T>_S<S>.json (T > 1), the
`kiln run --json` of each point, and torch_sweep.json (bench/gpu/torch_model.py). Per point:
kiln's and PyTorch's time a call (whole calls back to back, graphs replayed on both sides),
PyTorch's over kiln's (above 1 kiln is ahead), and for a decode step the bytes it must move
(the 32 layers' and the output projection's weights, 15.01 GB, and the caches' S rows) over
the device-copy bandwidth PyTorch's script measured in the same run, as a share of each
side's time (issue 28's target: 90% for kiln at S = 1024).
"""
import glob
import json
import os
import re
import sys

WEIGHT_BYTES = 32 * 4096 * (6144 + 4096 + 2 * 14336 + 14336) * 2 + 128256 * 4096 * 2
CACHE_BYTES_A_ROW = 32 * 2 * 8 * 128 * 2  # k and v, 8 KV heads of 128, bf16, 32 layers


def main():
    d = sys.argv[1]
    torch = {}
    copy = None
    tp = os.path.join(d, "torch_sweep.json")
    if os.path.exists(tp):
        tj = json.load(open(tp))
        copy = tj.get("copy_bandwidth_GBps")
        for r in tj.get("rows", []):
            torch[(r["T"], r["S"])] = r
    kiln = {}
    for f in glob.glob(os.path.join(d, "kiln_*.json")):
        m = re.search(r"kiln_(?:T(\d+)_)?S(\d+)\.json$", f)
        if not m:
            continue
        try:
            kiln[(int(m.group(1) or 1), int(m.group(2)))] = json.load(open(f))
        except (OSError, ValueError):
            pass  # a point that failed left no object
    print(f"copy bandwidth {copy:.0f} GB/s (PyTorch's script, 2N / t)" if copy else "copy bandwidth: not measured")
    print(f"{'T':>5} {'S':>6} {'kiln ms':>9} {'host us':>8} {'torch ms':>9} {'torch/kiln':>10} {'kiln %copy':>10} {'torch %copy':>11}")
    for t, s in sorted(set(kiln) | set(torch)):
        k, p = kiln.get((t, s)), torch.get((t, s))
        kms = k["call_ns"] / 1e6 if k else None
        pms = p["b2b_ms"] if p else None

        def f(x, w, fmt):
            return f"{x:{w}{fmt}}" if x is not None else f"{'-':>{w}}"

        ideal = None
        if t == 1 and copy:
            ideal = (WEIGHT_BYTES + CACHE_BYTES_A_ROW * s) / (copy * 1e9) * 1e3  # ms
        print(f"{t:>5} {s:>6} {f(kms, 9, '.3f')} {f(k['host_ns_per_call'] / 1e3 if k else None, 8, '.1f')} "
              f"{f(pms, 9, '.3f')} {f(pms / kms if kms and pms else None, 10, '.3f')} "
              f"{f(100 * ideal / kms if ideal and kms else None, 10, '.1f')} {f(100 * ideal / pms if ideal and pms else None, 11, '.1f')}")
    print("(whole calls back to back; %copy: the bytes a decode step moves at the copy bandwidth, over the time a call)")


if __name__ == "__main__":
    main()
