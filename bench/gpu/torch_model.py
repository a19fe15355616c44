#!/usr/bin/env python3
"""PyTorch's side of kiln's whole-model comparison (issue 28), on the GPU machine.

  torch_model.py --out FILE [--points 1,1024 ...] [--layers 32] [--forms reduce-overhead]

Llama-3-8B without its embedding lookup, as kernels/programs/model_llama3_8b.toml is: x (the
embedded tokens, T x 4096) through 32 decoder layers (bench/gpu/torch_decoder.py's Layer:
bf16, each with its own weights and static KV cache of a fixed capacity, written in place),
the final RMSNorm and the output projection to 128256 logits. Weights uniform in +-0.02,
norms' weights 1, as `kiln run` fills them (other values: timing does not depend on them).
Per point (T new tokens over a cache of S), for each form (eager; torch.compile with
mode="reduce-overhead": CUDA graphs, weights and caches at static addresses): whole calls
back to back between two CUDA events, as `kiln run` times its whole calls (call_ns), and the
host time a call. The caches are reset before each form, so every form computes the same.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch._dynamo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_decoder import H, Layer  # noqa: E402
from copy_bandwidth import copy_bandwidth  # noqa: E402

V = 128256


class Model(torch.nn.Module):
    def __init__(self, layers, cap, gen):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(cap, torch.bfloat16, gen) for _ in range(layers))
        self.gf = torch.nn.Parameter(torch.ones(H, device="cuda", dtype=torch.bfloat16), requires_grad=False)
        w = (torch.rand(V, H, device="cuda", generator=gen, dtype=torch.float32) - 0.5) * 0.04
        self.wlm = torch.nn.Parameter(w.bfloat16(), requires_grad=False)
        del w

    def forward(self, x, S: int):
        for layer in self.layers:
            x = layer(x, S)
        return Layer.rmsnorm(x, self.gf) @ self.wlm.t()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--points", nargs="+", default=["1,1024"])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--forms", default="eager,reduce-overhead")
    p.add_argument("--calls", type=int, default=50)
    a = p.parse_args()
    points = [tuple(int(v) for v in s.split(",")) for s in a.points]
    cap = max(t + s for t, s in points)
    gen = torch.Generator(device="cuda").manual_seed(0)
    t0 = time.perf_counter()
    model = Model(a.layers, cap, gen)
    caches = [(l.kc.clone(), l.vc.clone()) for l in model.layers] if len(points) > 1 or "," in a.forms else None
    bw = copy_bandwidth()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
           "layers": a.layers, "setup_s": time.perf_counter() - t0, "rows": [], "first_call_s": {}}
    print(f"{res['device']}, torch {res['torch']}: copy {bw / 1e9:.0f} GB/s; model made in {res['setup_s']:.1f} s",
          flush=True)
    for name in a.forms.split(","):
        torch._dynamo.reset()
        f = model if name == "eager" else torch.compile(model, mode=name)
        for t, s in points:
            if caches:
                for l, (kc, vc) in zip(model.layers, caches):
                    l.kc.copy_(kc)
                    l.vc.copy_(vc)
            x = ((torch.rand(t, H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(t)) - 0.5)
                 * 2).bfloat16()
            with torch.no_grad():
                c0 = time.perf_counter()
                f(x, s)
                torch.cuda.synchronize()
                first = time.perf_counter() - c0
                res["first_call_s"].setdefault(name, first)
                for _ in range(3):  # reduce-overhead records its graph after warm-up calls
                    f(x, s)
                torch.cuda.synchronize()
                h0 = time.perf_counter()
                e0.record()
                for _ in range(a.calls):
                    out = f(x, s)
                host_us = (time.perf_counter() - h0) / a.calls * 1e6
                e1.record()
                e1.synchronize()
                b2b = e0.elapsed_time(e1) / a.calls
            row = {"form": name, "T": t, "S": s, "b2b_ms": b2b, "host_us": host_us, "first_s": first,
                   "finite": bool(torch.isfinite(out.float()).all().item())}
            res["rows"].append(row)
            with open(a.out, "w") as fo:  # after every row: a run cut short keeps what it measured
                json.dump(res, fo, indent=1)
            print(f"{name} T={t} S={s}: {b2b:.3f} ms a call back to back, {host_us:.0f} us of host time a call, "
                  f"first call {first:.1f} s, logits finite: {row['finite']}", flush=True)


if __name__ == "__main__":
    main()
