#!/usr/bin/env python3
"""PyTorch's side of kiln's bf16 GEMM comparison (issue 20), on the GPU machine.

  torch_gemm.py --out FILE

For each shape (M x K @ (N x K)^T, bf16, a linear layer's weight):
  - torch.mm: x @ w.t() (cuBLAS / cuBLASLt through PyTorch);
  - torch.compile(dynamic=True, mode="max-autotune-no-cudagraphs") of the same,
    compiled once per weight shape (its first call, at the largest M, picks the
    Triton template or aten, as Inductor does with dynamic shapes);
and for the gate/up shapes, eager silu(x @ wg.t()) * (x @ wu.t()) (two GEMMs and
the elementwise kernels). Times: triton.testing.do_bench medians (it writes a
buffer larger than the L2 before each run, as kiln's timings do), ms. Also the
device's copy bandwidth (a 1 GiB device-to-device copy, bytes read + written).
Every result is checked against float64 on a sample of rows.
"""
import argparse
import json
import time

import torch
import torch._dynamo
from triton.testing import do_bench

SQUARES = [1024, 4096, 8192]
TOKENS = [1, 8, 64, 256, 1024, 4096]
H, I = 4096, 14336


def shapes():
    out = [("square", n, n, n) for n in SQUARES]
    for t in TOKENS:
        out.append(("up", t, I, H))    # T x 4096 @ 4096 x 14336
        out.append(("down", t, H, I))  # T x 14336 @ 14336 x 4096
    return out


def rand(*shape, g):
    return (torch.rand(*shape, device="cuda", generator=g) - 0.5).bfloat16()


def check(out, x, w):
    rows = min(x.shape[0], 64)
    ref = x[:rows].double() @ w.double().t()
    err = ((out[:rows].double() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, f"relative error {err}"
    return err


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": [], "gated": []}

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    res["copy_bandwidth_GBps"] = 2 * (1 << 30) / (ms * 1e-3) / 1e9
    del src, dst
    print(f"copy bandwidth: {res['copy_bandwidth_GBps']:.0f} GB/s", flush=True)

    compiled = {}
    by_weight = {}
    for kind, m, n, k in shapes():
        by_weight.setdefault((n, k), []).append((kind, m))
    for (n, k), uses in by_weight.items():
        w = rand(n, k, g=g)
        torch._dynamo.reset()
        f = torch.compile(lambda x, w: x @ w.t(), dynamic=True, mode="max-autotune-no-cudagraphs")
        big = max(m for _, m in uses)
        t0 = time.perf_counter()
        f(rand(big, k, g=g), w)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        for kind, m in uses:
            x = rand(m, k, g=g)
            check(torch.mm(x, w.t()), x, w)
            check(f(x, w), x, w)
            t_mm = do_bench(lambda: torch.mm(x, w.t()), return_mode="median")
            t_tc = do_bench(lambda: f(x, w), return_mode="median")
            res["rows"].append({"kind": kind, "M": m, "N": n, "K": k, "torch_mm_ms": t_mm, "compile_ms": t_tc,
                                "compile_first_call_s": compile_s if m == big else None})
            print(f"{kind:>6} {m:>5}x{n:>5}x{k:>5}: torch.mm {t_mm:.4f} ms, torch.compile {t_tc:.4f} ms", flush=True)
        del w
    wg, wu = rand(I, H, g=g), rand(I, H, g=g)
    for t in TOKENS:
        x = rand(t, H, g=g)
        sep = lambda: torch.nn.functional.silu(x @ wg.t()) * (x @ wu.t())  # noqa: E731
        out = sep()
        ref = torch.nn.functional.silu(x[:64].double() @ wg.double().t()) * (x[:64].double() @ wu.double().t())
        err = ((out[:64].double() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, err
        ms = do_bench(sep, return_mode="median")
        res["gated"].append({"T": t, "separate_ms": ms})
        print(f"gated T={t}: eager separate {ms:.4f} ms", flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
