#!/usr/bin/env python3
"""PyTorch's side of kiln's MLP-block comparison (issue 21), on the GPU machine.

  torch_mlp.py --out FILE --tokens 1,8,64,...

The Llama-3-8B MLP block in bf16 (H = 4096, I = 14336, weights out x in):
  n = rmsnorm(x) * g;  y = x + (silu(n Wg^T) * (n Wu^T)) Wd^T
as eager PyTorch, torch.compile(dynamic=True) and torch.compile(dynamic=True,
mode="max-autotune-no-cudagraphs"). Per token count T: the device time per call
(triton.testing.do_bench median, ms; and calls back to back between two events, as
`kiln run` times whole calls) and the host time per call (calls queued
back to back without synchronising, wall time over calls, us). For each compiled
form: its first call (compiling, and for max-autotune benchmarking; a fresh
TORCHINDUCTOR_CACHE_DIR makes it cold), in this process. Also the device's copy
bandwidth. Results are checked against a float64 computation on a few rows.
"""
import argparse
import json
import time

import torch
import torch._dynamo
from triton.testing import do_bench

H, I = 4096, 14336


def block(x, g, wg, wu, wd):
    xf = x.float()
    n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * g
    h = torch.nn.functional.silu(n @ wg.t()) * (n @ wu.t())
    return x + h @ wd.t()


def block_t(x, g, wgt, wut, wdt):
    """The same block with the weights stored in x out (the transposes of a linear layer's)."""
    xf = x.float()
    n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * g
    h = torch.nn.functional.silu(n @ wgt) * (n @ wut)
    return x + h @ wdt


def reference(x, g, wg, wu, wd, rows=8):
    xd = x[:rows].double()
    n = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * g.double()
    h = torch.nn.functional.silu(n @ wg.double().t()) * (n @ wu.double().t())
    return xd + h @ wd.double().t()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", default="1,8,64,256,1024,4096")
    p.add_argument("--forms", default="eager,compile,max-autotune", help="which of eager, compile, max-autotune")
    p.add_argument("--layouts", default="out_in",
                   help="out_in (weights as a linear layer stores them), in_out (their transposes), or both: out_in,in_out")
    a = p.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s, scale=1.0):
        return ((torch.rand(*s, device="cuda", generator=gen) - 0.5) * 2 * scale).bfloat16()

    g = rnd(H) + 1
    wg, wu, wd = rnd(I, H, scale=0.02), rnd(I, H, scale=0.02), rnd(H, I, scale=0.02)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    bw = 2 * (1 << 30) / (do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3)
    del src, dst
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
           "weights_bytes": 3 * H * I * 2, "rows": [], "first_call_s": {}}
    want = a.forms.split(",")
    layouts = a.layouts.split(",")
    wts = (wg.t().contiguous(), wu.t().contiguous(), wd.t().contiguous())
    forms = {}
    for lay in layouts:
        fn = block if lay == "out_in" else lambda x, g, wg_, wu_, wd_: block_t(x, g, *wts)
        tag = "" if lay == "out_in" else "[in x out]"
        if "eager" in want:
            forms["eager" + tag] = fn
        for name, mode in (("compile", None), ("max-autotune", "max-autotune-no-cudagraphs")):
            if name in want:
                torch._dynamo.reset()
                forms[name + tag] = torch.compile(fn, dynamic=True, mode=mode)
    for t in tokens:
        x = rnd(t, H)
        row = {"T": t}
        ref = reference(x, g, wg, wu, wd)
        for name, f in forms.items():
            if name not in res["first_call_s"]:
                t0 = time.perf_counter()
                f(x, g, wg, wu, wd)
                torch.cuda.synchronize()
                res["first_call_s"][name] = time.perf_counter() - t0
            out = f(x, g, wg, wu, wd)
            torch.cuda.synchronize()
            err = ((out[:8].double() - ref).norm() / ref.norm()).item()
            assert err < 2e-2, f"{name} T={t}: relative error {err}"
            row[name + "_ms"] = do_bench(lambda: f(x, g, wg, wu, wd), return_mode="median")
            for _ in range(3):
                f(x, g, wg, wu, wd)
            torch.cuda.synchronize()
            n = 50
            h0 = time.perf_counter()
            for _ in range(n):
                f(x, g, wg, wu, wd)
            row[name + "_host_us"] = (time.perf_counter() - h0) / n * 1e6
            torch.cuda.synchronize()
            # Calls back to back between two events, as `kiln run` times whole calls.
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(n):
                f(x, g, wg, wu, wd)
            e1.record()
            e1.synchronize()
            row[name + "_b2b_ms"] = e0.elapsed_time(e1) / n
        res["rows"].append(row)
        with open(a.out, "w") as fo:  # after every row: a run cut short keeps what it measured
            json.dump(res, fo, indent=1)
        print(f"T={t}: " + ", ".join(f"{k} {row[k + '_ms']:.4f} ms (b2b {row[k + '_b2b_ms']:.4f}) / host {row[k + '_host_us']:.1f} us"
                                     for k in forms), flush=True)
    print("first calls (s): " + ", ".join(f"{k} {v:.1f}" for k, v in res["first_call_s"].items()), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
