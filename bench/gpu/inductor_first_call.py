#!/usr/bin/env python3
"""Inductor's first call of a matmul in this (fresh) process, for kiln's first-call comparison.

  inductor_first_call.py --dtype fp32|bf16 --m M --n N --k K [--mode max-autotune]

fp32: C = A @ B (A M x K, B K x N, TF32 off); bf16: C = A @ W.T (W N x K, a linear
layer's weight). torch.compile(dynamic=True, mode=...). Prints one line:
  "import=<s> first=<s>"  (first: from before the inputs are made, CUDA set-up
included, to the first result, synchronised; import: `import torch`).
Run it twice with one TORCHINDUCTOR_CACHE_DIR: cold, then warm. The result is
checked against float64.
"""
import argparse
import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402

import_s = time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", choices=["fp32", "bf16"], required=True)
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--mode", default="max-autotune")
    a = p.parse_args()
    t = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    g = torch.Generator(device="cuda").manual_seed(1)
    if a.dtype == "fp32":
        x = torch.rand(a.m, a.k, device="cuda", generator=g) - 0.5
        w = torch.rand(a.k, a.n, device="cuda", generator=g) - 0.5
        f = torch.compile(lambda x, w: x @ w, dynamic=True, mode=a.mode)
        ref = lambda: x.double() @ w.double()  # noqa: E731
        tol = 1e-4
    else:
        x = (torch.rand(a.m, a.k, device="cuda", generator=g) - 0.5).bfloat16()
        w = (torch.rand(a.n, a.k, device="cuda", generator=g) - 0.5).bfloat16()
        f = torch.compile(lambda x, w: x @ w.t(), dynamic=True, mode=a.mode)
        ref = lambda: x.double() @ w.double().t()  # noqa: E731
        tol = 1e-2
    out = f(x, w)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t
    r = ref()
    err = ((out.double() - r).norm() / r.norm()).item()
    if not err < tol:
        print(f"wrong result: relative error {err}", file=sys.stderr)
        sys.exit(1)
    print(f"import={import_s:.3f} first={first_s:.3f}")


if __name__ == "__main__":
    main()
