#!/usr/bin/env python3
"""PyTorch's side of the decode bandwidth comparison (bench/gpu/decode_bandwidth.sh), timed
the way that script times kiln's decode kernels and cuBLAS:
  b2b:   calls back to back between two CUDA events, each on the next of a ring of weight
         copies that together hold at least 4x L2 (no call finds its weights in L2);
  flush: single calls after a 256 MB write, the median of 50.
Eager PyTorch, bf16, with the weight in both layouts: out x in as a linear layer keeps it
(x @ w.t(), F.linear) and in x out (x @ wt); the fastest is the peer. The copy bandwidth is
a 1 GiB device-to-device copy, 2N / t, back to back. Every result is checked against
float64 first.
  torch_decode.py [--out FILE]"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

SHAPES = [(1, 4096, 4096), (1, 14336, 4096), (1, 4096, 14336), (8, 14336, 4096), (16, 4096, 14336),
          (4, 5120, 5120), (1, 3584, 18944), (12, 8192, 3072)]


def events_ms(fn, reps):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(reps):
        fn(i)
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / reps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    a = p.parse_args()
    torch.manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy = 2 * (1 << 30) / (events_ms(lambda i: dst.copy_(src), 10) * 1e-3) / 1e9
    del src, dst
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; copy {copy:.0f} GB/s; L2 {l2 >> 20} MB")
    rows = []
    for M, N, K in SHAPES:
        wbytes = N * K * 2
        ring = max(2, math.ceil(4 * l2 / wbytes))
        x = (torch.rand(M, K, device="cuda") - 0.5).bfloat16()
        ws = [(torch.rand(N, K, device="cuda") - 0.5).bfloat16() for _ in range(ring)]
        wts = [w.t().contiguous() for w in ws]
        ref = x.double() @ ws[0].double().t()
        forms = {"x@w.t()": lambda i: x @ ws[i % ring].t(), "F.linear": lambda i: F.linear(x, ws[i % ring]),
                 "x@wt": lambda i: x @ wts[i % ring]}
        row = {"M": M, "N": N, "K": K, "ring": ring}
        for name, fn in forms.items():
            err = ((fn(0).double() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"{name} at {M}x{N}x{K}: relative error {err}"
            for i in range(ring):
                fn(i)
            b2b = events_ms(fn, max(200, 4 * ring))
            ts = []
            for i in range(50):
                flush.fill_(i & 0xFF)
                ts.append(events_ms(lambda _: fn(0), 1))
            fl = sorted(ts)[len(ts) // 2]
            row[name] = {"b2b_ms": b2b, "flush_ms": fl, "b2b_pct": 100 * wbytes / (b2b * 1e-3) / 1e9 / copy,
                         "flush_pct": 100 * wbytes / (fl * 1e-3) / 1e9 / copy}
        best = max(forms, key=lambda n: row[n]["b2b_pct"])
        print(f"  {M}x{N}x{K} ring {ring}: " + "  ".join(
            f"{n} b2b {row[n]['b2b_pct']:.1f}% flush {row[n]['flush_pct']:.1f}%" for n in forms) + f"  (fastest: {best})")
        rows.append(row)
        del ws, wts
    if a.out:
        json.dump({"copy_GBps": copy, "rows": rows}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
