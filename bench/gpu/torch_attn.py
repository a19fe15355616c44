#!/usr/bin/env python3
"""PyTorch's decode attention beside kiln's (bench/gpu/attn_decode.sh): torch_attn.py --points "T,S ..." --out F

Llama-3-8B's heads (32 query heads, 8 KV heads of 128), bf16, a static cache of S + T
rows, q of T new tokens; F.scaled_dot_product_attention with enable_gqa and the causal mask
aligned bottom-right (for T > 1), each SDPA backend forced in turn (and the default),
timed as kiln times: single calls after an L2 flush (events around each call), the median.
Every form's result is checked against a float64 computation. Also the device-to-device
copy bandwidth (a 1 GiB copy, 2N / t, back to back), against which the cache read is given.
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128


def flushed_ms(fn, flush, reps=20):
    ts = []
    for _ in range(reps):
        flush.zero_()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--points", required=True)
    p.add_argument("--out")
    a = p.parse_args()
    torch.manual_seed(0)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        dst.copy_(src)
    e1.record()
    e1.synchronize()
    copy = 2 * (1 << 30) / (e0.elapsed_time(e1) / 10 * 1e-3) / 1e9
    del src, dst
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; copy {copy:.0f} GB/s")
    rows = []
    for pt in a.points.split():
        T, S = (int(x) for x in pt.split(","))
        n = S + T
        q = (torch.rand(1, HQ, T, D, device="cuda") - 0.5).bfloat16()
        k = (torch.rand(1, HKV, n, D, device="cuda") - 0.5).bfloat16()
        v = (torch.rand(1, HKV, n, D, device="cuda") - 0.5).bfloat16()
        # causal, bottom-right: token i sees keys 0 .. S + i (with S = 0, SDPA's is_causal, which
        # every backend takes; with S > 0, a boolean mask)
        mask = None
        causal = T > 1 and S == 0
        if T > 1 and S > 0:
            mask = torch.arange(n, device="cuda")[None, :] <= (S + torch.arange(T, device="cuda"))[:, None]
        # The float64 reference on at most 128 query rows (the first 64 and the last 64).
        rows_ = torch.arange(T, device="cuda")
        if T > 128:
            rows_ = torch.cat([rows_[:64], rows_[-64:]])
        kr, vr = k.double().repeat_interleave(HQ // HKV, 1), v.double().repeat_interleave(HQ // HKV, 1)
        sc = q[:, :, rows_].double() @ kr.transpose(-1, -2) / math.sqrt(D)
        if T > 1:
            vis = torch.arange(n, device="cuda")[None, :] <= (S + rows_)[:, None]
            sc = sc.masked_fill(~vis, float("-inf"))
        ref = torch.softmax(sc, -1) @ vr
        del sc, kr, vr
        row = {"T": T, "S": S, "cache_bytes": 2 * n * HKV * D * 2}
        for name, be in [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]:
            fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
            try:
                if be is None:
                    out = fn()
                    ms = flushed_ms(fn, flush)
                else:
                    with sdpa_kernel([be]):
                        out = fn()
                        ms = flushed_ms(fn, flush)
            except Exception as e:  # a backend that cannot run this form
                row[name] = {"error": str(e).splitlines()[0][:200]}
                continue
            err = ((out[:, :, rows_].double() - ref).norm() / ref.norm()).item()
            row[name] = {"ms": ms, "rel_err": err, "checked": err < 2e-2,
                         "pct_copy": 100 * row["cache_bytes"] / (ms * 1e-3) / 1e9 / copy}
        rows.append(row)
        best = min((r["ms"], n_) for n_, r in row.items() if isinstance(r, dict) and r.get("checked"))
        print(f"T={T} S={S}: fastest checked SDPA {best[1]} {best[0]*1e3:.1f} us")
    if a.out:
        json.dump({"copy_GBps": copy, "rows": rows}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
