#!/usr/bin/env python3
"""PyTorch's side of bench/gpu/forms.sh, timed the way kiln's tuner times a multi-kernel's
variants by default (a single call after a write larger than L2, between two CUDA events;
the median of 30) and back to back (30 calls between two events, the mean):
  gated:      the MLP's gate/up projection silu(x Wg^T) * (x Wu^T) at each T, eager, in
              three forms (two GEMMs then SiLU·mul with the weights out x in and in x out,
              and one GEMM over the concatenated weights); the fastest is the peer;
              torch.compile (default mode, dynamic shapes) of the first form with --compile;
  misaligned: torch.mm at shapes whose K is not a multiple of 8 (F.linear with the weight
              N x K, x @ wt with it K x N), and at the aligned shape next to each
              (K rounded up to 8): cuBLAS's rate there is what misalignment costs.
Every result is checked against float64 first.
  torch_forms.py --ts 1,16,... --gated N,K --misaligned M,N,K;M,N,K [--compile] [--out FILE]"""
import argparse
import json

import torch
import torch.nn.functional as F


def events_ms(fn, reps):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / reps


def timed(fn, flush):
    for _ in range(3):
        fn()
    b2b = events_ms(fn, 30)
    ts = []
    for i in range(30):
        flush.fill_(i & 0xFF)
        ts.append(events_ms(fn, 1))
    return {"flush_us": 1e3 * sorted(ts)[len(ts) // 2], "b2b_us": 1e3 * b2b}


def check(got, ref, what):
    err = ((got.double() - ref).norm() / ref.norm()).item()
    assert err < 2e-2, f"{what}: relative error {err}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ts", default="")
    p.add_argument("--gated", default="14336,4096")
    p.add_argument("--misaligned", default="")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--out")
    a = p.parse_args()
    torch.manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "gated": [], "misaligned": []}
    N, K = map(int, a.gated.split(","))
    if a.ts:
        wg = (torch.rand(N, K, device="cuda") - 0.5).bfloat16()
        wu = (torch.rand(N, K, device="cuda") - 0.5).bfloat16()
        wgt, wut = wg.t().contiguous(), wu.t().contiguous()
        wgu = torch.cat([wg, wu], 0)

        def two(x):
            return F.silu(F.linear(x, wg)) * F.linear(x, wu)

        forms = {
            "two GEMMs (W out x in)": two,
            "two GEMMs (W in x out)": lambda x: F.silu(x @ wgt) * (x @ wut),
            "one GEMM of 2N (W out x in)": lambda x: (lambda h: F.silu(h[:, :N]) * h[:, N:])(F.linear(x, wgu)),
        }
        compiled = torch.compile(two, dynamic=True) if a.compile else None
        for T in map(int, a.ts.split(",")):
            x = (torch.rand(T, K, device="cuda") - 0.5).bfloat16()
            xd = x.double()
            g, u = xd @ wg.double().t(), xd @ wu.double().t()
            ref = g * torch.sigmoid(g) * u
            row = {"T": T, "N": N, "K": K}
            for name, fn in list(forms.items()) + ([("torch.compile", compiled)] if compiled else []):
                check(fn(x), ref, f"{name} at T={T}")
                row[name] = timed(lambda: fn(x), flush)
            eager = [n for n in forms]
            best = min(eager, key=lambda n: row[n]["flush_us"])
            row["fastest_eager_flush"] = best
            row["fastest_eager_b2b"] = min(eager, key=lambda n: row[n]["b2b_us"])
            print(f"  gated T={T}: " + "  ".join(
                f"{n} {row[n]['flush_us']:.1f}/{row[n]['b2b_us']:.1f}us" for n in row if isinstance(row[n], dict)))
            out["gated"].append(row)
    for spec in filter(None, a.misaligned.split(";")):
        M, N2, K2 = map(int, spec.split(","))
        row = {"M": M, "N": N2, "K": K2}
        for tag, k in (("misaligned", K2), ("aligned", (K2 + 7) // 8 * 8)):
            x = (torch.rand(M, k, device="cuda") - 0.5).bfloat16()
            w = (torch.rand(N2, k, device="cuda") - 0.5).bfloat16()
            wt = w.t().contiguous()
            ref = x.double() @ w.double().t()
            fs = {"F.linear (W out x in)": lambda: F.linear(x, w), "x @ wt (W in x out)": lambda: x @ wt}
            for name, fn in fs.items():
                check(fn(), ref, f"{name} at {M}x{N2}x{k}")
                row[f"{tag}: {name}"] = timed(fn, flush)
            row[f"{tag}_K"] = k
        print(f"  mm {M}x{N2}x{K2}: " + "  ".join(
            f"{n} {row[n]['flush_us']:.1f}/{row[n]['b2b_us']:.1f}us" for n in row if isinstance(row[n], dict)))
        out["misaligned"].append(row)
    if a.out:
        json.dump(out, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
