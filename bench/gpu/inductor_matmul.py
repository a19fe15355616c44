#!/usr/bin/env python3
"""The PyTorch Inductor side of kiln's matmul side-by-side (runs on the GPU machine).

  inductor_matmul.py table --json FILE [--sizes 64,256,1024,4096] [--hints 64,256,4096]
      fp32 C = A @ B at M = N = K, TF32 off, compiled with torch.compile(dynamic=True,
      mode="max-autotune"):
        - one row per hint h: a fresh compile whose first call is at size h (so it is
          tuned at h), then timed at every size;
        - the multi-kernel row: config.multi_kernel_hints = hints, triton.multi_kernel = 1;
        - cuBLAS: torch.mm.
      Times are medians of triton.testing.do_bench (ms), every result checked against
      float64. Caches are off, so no row reuses another's tuning. Inductor's own
      autotuning log (stderr) gives its best Triton template against its aten choice.
  inductor_matmul.py first --n N --out FILE [--hints ...]
      Time to the first launch in this process: from before the inputs are made (CUDA
      set-up included, `import torch` not) to the first result, synchronised. Run it
      twice with one TORCHINDUCTOR_CACHE_DIR: cold, then warm. Writes
      {"seconds": .., "import_seconds": ..} to FILE.
"""
import argparse
import json
import os
import sys
import time

t_import = time.perf_counter()
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import_s = time.perf_counter() - t_import


def fp32_only():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def mm(a, b):
    return a @ b


def inputs(n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.rand(n, n, device="cuda", generator=g) - 0.5
    b = torch.rand(n, n, device="cuda", generator=g) - 0.5
    return a, b


def rel_err(out, a, b):
    ref = a.double() @ b.double()
    return ((out.double() - ref).norm() / ref.norm()).item()


def compiled(multi_hints):
    torch._dynamo.reset()
    if multi_hints:
        inductor_config.triton.multi_kernel = 1
        inductor_config.multi_kernel_hints = list(multi_hints)
    else:
        inductor_config.triton.multi_kernel = 0
        inductor_config.multi_kernel_hints = []
    return torch.compile(mm, dynamic=True, mode="max-autotune")


def table(args):
    fp32_only()
    inductor_config.force_disable_caches = True
    sizes = [int(s) for s in args.sizes.split(",")]
    hints = [int(s) for s in args.hints.split(",")]
    data = {s: inputs(s, s) for s in sizes}
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "sizes": sizes, "hints": hints,
           "rows": [], "max_rel_err": 0.0}

    def time_row(label, f, first_n):
        t0 = time.perf_counter()
        if first_n is not None:
            a, b = inputs(first_n, 12345)
            f(a, b)  # the first call: compiled and tuned at this size
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        ms = []
        for s in sizes:
            a, b = data[s]
            r = f(a, b)
            torch.cuda.synchronize()
            out["max_rel_err"] = max(out["max_rel_err"], rel_err(r, a, b))
            ms.append(do_bench(lambda: f(a, b), return_mode="median"))
        out["rows"].append({"label": label, "ms": ms, "first_call_s": compile_s})
        print(f"{label:<28}" + "".join(f"{m:>10.4f}" for m in ms) + f"   (first call {compile_s:.1f} s)", flush=True)

    print(f"{'ms':<28}" + "".join(f"{s:>10}" for s in sizes), flush=True)
    time_row("cuBLAS (torch.mm)", torch.mm, None)
    for h in hints:
        time_row(f"Inductor tuned at {h}", compiled(None), h)
    time_row(f"Inductor multi-kernel", compiled(hints), hints[0])
    print(f"largest relative error against float64: {out['max_rel_err']:.2e}")
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


def first(args):
    t0 = time.perf_counter()
    fp32_only()
    hints = [int(s) for s in args.hints.split(",")] if args.hints else None
    f = compiled(hints)
    a, b = inputs(args.n, 1)
    r = f(a, b)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    err = rel_err(r, a, b)
    if not err < 1e-4:
        print(f"wrong result: relative error {err}", file=sys.stderr)
        sys.exit(1)
    with open(args.out, "w") as f:
        json.dump({"seconds": round(secs, 3), "import_seconds": round(import_s, 3), "n": args.n}, f)
    print(f"first launch at n = {args.n}: {secs:.3f} s (import torch: {import_s:.3f} s)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table")
    t.add_argument("--json", required=True)
    t.add_argument("--sizes", default="64,256,1024,4096")
    t.add_argument("--hints", default="64,256,4096")
    fi = sub.add_parser("first")
    fi.add_argument("--n", type=int, default=1024)
    fi.add_argument("--hints", default="")
    fi.add_argument("--out", required=True)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("no GPU", file=sys.stderr)
        sys.exit(2)
    {"table": table, "first": first}[a.cmd](a)


if __name__ == "__main__":
    main()
