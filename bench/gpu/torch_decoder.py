#!/usr/bin/env python3
"""PyTorch's side of kiln's decoder-layer comparison (issue 27), on the GPU machine.

  torch_decoder.py --out FILE --points 1,1024 128,0 ...   (each T,S: T new tokens over a cache of S)

The Llama-3-8B decoder layer in bf16 (H = 4096, 32 query heads, 8 KV heads of 128,
I = 14336, RoPE theta 500000 rotate-half, RMSNorm eps 1e-5), weights out x in, the KV cache
static (module buffers of a fixed capacity, written in place at rows S .. S+T-1):
  n = rmsnorm(x) g1; q, k, v = n Wqkv^T; rope; cache write; a = SDPA(q, cache[:S+T], GQA,
  causal aligned bottom-right); x2 = x + a Wo^T; y = x2 + mlp(rmsnorm(x2) g2)
as eager PyTorch (scaled_dot_product_attention with enable_gqa), torch.compile(dynamic=True)
and torch.compile(mode="reduce-overhead", dynamic=True) (CUDA graphs; weights and cache at
static addresses). Per point: calls back to back between two events (as `kiln run` times
whole calls: its call_ns), the triton do_bench median (an L2 flush before each call) and
the host time per call. Each form's result is checked against the same layer in float64
on the same inputs and cache.
"""
import argparse
import json
import time

import torch
import torch._dynamo
from triton.testing import do_bench

H, HQ, HKV, D, I = 4096, 32, 8, 128, 14336
THETA, EPS = 500000.0, 1e-5


class Layer(torch.nn.Module):
    def __init__(self, cap, dtype, gen):
        super().__init__()

        def rnd(*s, scale=1.0):
            return ((torch.rand(*s, device="cuda", generator=gen, dtype=torch.float64) - 0.5) * 2 * scale).to(dtype)

        self.g1 = torch.nn.Parameter(torch.ones(H, device="cuda", dtype=dtype), requires_grad=False)
        self.g2 = torch.nn.Parameter(torch.ones(H, device="cuda", dtype=dtype), requires_grad=False)
        self.wqkv = torch.nn.Parameter(rnd((HQ + 2 * HKV) * D, H, scale=0.02), requires_grad=False)
        self.wo = torch.nn.Parameter(rnd(H, HQ * D, scale=0.02), requires_grad=False)
        self.wg = torch.nn.Parameter(rnd(I, H, scale=0.02), requires_grad=False)
        self.wu = torch.nn.Parameter(rnd(I, H, scale=0.02), requires_grad=False)
        self.wd = torch.nn.Parameter(rnd(H, I, scale=0.02), requires_grad=False)
        self.register_buffer("kc", rnd(cap, HKV, D))
        self.register_buffer("vc", rnd(cap, HKV, D))
        inv = 1.0 / (THETA ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float64) / D))
        ang = torch.arange(cap, device="cuda", dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], -1)
        self.register_buffer("cos", ang.cos().float() if dtype != torch.float64 else ang.cos())
        self.register_buffer("sin", ang.sin().float() if dtype != torch.float64 else ang.sin())

    @staticmethod
    def rmsnorm(x, g):
        xf = x.float() if x.dtype != torch.float64 else x
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * g

    def rope(self, t, S, T):
        cos, sin = self.cos[S:S + T, None, :], self.sin[S:S + T, None, :]
        tf = t.float() if t.dtype != torch.float64 else t
        half = torch.cat([-tf[..., D // 2:], tf[..., :D // 2]], -1)
        return (tf * cos + half * sin).to(t.dtype)

    def forward(self, x, S: int):
        T = x.shape[0]
        n = self.rmsnorm(x, self.g1)
        qkv = n @ self.wqkv.t()
        q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], -1)
        q = self.rope(q.view(T, HQ, D), S, T)
        k = self.rope(k.view(T, HKV, D), S, T)
        self.kc[S:S + T] = k
        self.vc[S:S + T] = v.view(T, HKV, D)
        qh = q.transpose(0, 1)[None]
        kh = self.kc[:S + T].transpose(0, 1)[None]
        vh = self.vc[:S + T].transpose(0, 1)[None]
        if T == 1:
            a = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
        elif S == 0:
            a = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        else:  # bottom-right: token i sees keys 0 .. S + i
            mask = torch.ones(T, S + T, device=x.device, dtype=torch.bool).tril(S)
            a = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
        a = a[0].transpose(0, 1).reshape(T, HQ * D)
        x2 = x + a @ self.wo.t()
        n2 = self.rmsnorm(x2, self.g2)
        h = torch.nn.functional.silu(n2 @ self.wg.t()) * (n2 @ self.wu.t())
        return x2 + h @ self.wd.t()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--points", nargs="+", default=["1,1024", "128,0", "1024,0"])
    p.add_argument("--forms", default="eager,compile,reduce-overhead")
    p.add_argument("--ncu", action="store_true",
                   help="after the warm-up calls, one call of each form between cudaProfilerStart and Stop "
                        "(for ncu --profile-from-start off), then the next point: no timing, no reference")
    a = p.parse_args()
    points = [tuple(int(v) for v in s.split(",")) for s in a.points]
    cap = max(t + s for t, s in points)
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer = Layer(cap, torch.bfloat16, gen)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    bw = 2 * (1 << 30) / (do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3)
    del src, dst
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
           "rows": [], "first_call_s": {}}
    forms = {}
    for name in a.forms.split(","):
        torch._dynamo.reset()
        if name == "eager":
            forms[name] = layer
        elif name == "compile":
            forms[name] = torch.compile(layer, dynamic=True)
        elif name == "reduce-overhead":
            forms[name] = torch.compile(layer, dynamic=True, mode="reduce-overhead")
    kc0, vc0 = layer.kc.clone(), layer.vc.clone()
    # The reference: the same layer in float64 on the same weights, inputs and cache.
    ref_layer = Layer(1, torch.float64, torch.Generator(device="cuda").manual_seed(0))
    for nm in ("g1", "g2", "wqkv", "wo", "wg", "wu", "wd"):
        getattr(ref_layer, nm).data = getattr(layer, nm).data.double()
    inv = 1.0 / (THETA ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float64) / D))
    ang = torch.arange(cap, device="cuda", dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    ref_layer.cos, ref_layer.sin = ang.cos(), ang.sin()
    for t, s in points:
        x = ((torch.rand(t, H, device="cuda", generator=gen) - 0.5) * 2).bfloat16()
        ref = None
        if t * (s + t) <= 1 << 24 and not a.ncu:  # the float64 scores fit (32 heads x T x (S + T) x 8 bytes)
            ref_layer.kc, ref_layer.vc = kc0.double().clone(), vc0.double().clone()
            with torch.no_grad():
                ref = ref_layer(x.double(), s)
        row = {"T": t, "S": s}
        for name, f in forms.items():
            layer.kc.copy_(kc0)
            layer.vc.copy_(vc0)
            with torch.no_grad():
                if name not in res["first_call_s"]:
                    t0 = time.perf_counter()
                    f(x, s)
                    torch.cuda.synchronize()
                    res["first_call_s"][name] = time.perf_counter() - t0
                for _ in range(3):  # reduce-overhead records its graph after warm-up calls
                    out = f(x, s)
                torch.cuda.synchronize()
                if a.ncu:
                    torch.cuda.profiler.start()
                    f(x, s)
                    torch.cuda.synchronize()
                    torch.cuda.profiler.stop()
                    continue
                err = ((out.double() - ref).norm() / ref.norm()).item() if ref is not None else float("nan")
                row[name + "_rel_err"] = err
                assert ref is None or err < 2e-2, f"{name} T={t} S={s}: relative error {err}"
                row[name + "_ms"] = do_bench(lambda: f(x, s), return_mode="median")
                n = 30
                torch.cuda.synchronize()
                h0 = time.perf_counter()
                for _ in range(n):
                    f(x, s)
                row[name + "_host_us"] = (time.perf_counter() - h0) / n * 1e6
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(n):
                    f(x, s)
                e1.record()
                e1.synchronize()
                row[name + "_b2b_ms"] = e0.elapsed_time(e1) / n
        if a.ncu:
            continue
        res["rows"].append(row)
        with open(a.out, "w") as fo:  # after every row: a run cut short keeps what it measured
            json.dump(res, fo, indent=1)
        print(f"T={t} S={s}: " + ", ".join(f"{k} b2b {row[k + '_b2b_ms']:.4f} ms (flushed {row[k + '_ms']:.4f}, "
                                           f"err {row[k + '_rel_err']:.1e})" for k in forms), flush=True)
    print("first calls (s): " + ", ".join(f"{k} {v:.1f}" for k, v in res["first_call_s"].items()), flush=True)


if __name__ == "__main__":
    main()
