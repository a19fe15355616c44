#!/usr/bin/env python3
"""The whole model's result check (issue 28): kiln's logits against PyTorch in float32.

  torch_logits.py DIR [--out FILE]

DIR is what build/bench/kiln_bench_model_logits wrote for a model program (kernels/programs/model_*.toml):
meta.json (the seeds, the calls) and call<k>.logits.bin (kiln's bf16 logits of call k: a prompt,
then decode steps). This script makes the same weights and inputs from the seeds with kiln's
generator (include/kiln/fill.hpp), reimplemented here in 64-bit integer arithmetic on the GPU,
first checking the values kiln reported for each input; then runs the same calls through the same
model, written here from its definition (the sizes read from the inputs' shapes; rotate-half RoPE
at theta 500000, RMSNorm eps 1e-5, GQA attention over a static cache, causal bottom-right), in
float32 and, for scale, in bf16. On the GPU when there is one, else on the cpu (the cpu model,
model_cpu.toml, checks this script and kiln's cpu kernels without a GPU).
Per call it prints the relative L2 error of kiln's logits against float32 (||kiln - f32|| /
||f32||, over the call's rows, and its worst row), the same for PyTorch's own bf16 model, and how
often the top-1 token agrees. It passes when every row of every call is within 3e-2 (bf16 logits;
1e-4 for f32) and finite; the exit code is 1 when not.
"""
import argparse
import json
import math
import os
import sys
import time

import torch

THETA, EPS = 500000.0, 1e-5
DEV = "cuda" if torch.cuda.is_available() else "cpu"

GAMMA, M1, M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def s64(v):
    """An unsigned 64-bit constant as the int64 of the same bits."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def srl(z, k):
    """A logical right shift of int64 bits."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def uniform(seed, start, count):
    """Elements start .. start+count-1 of kiln's generator with this seed: 2u - 1 in float64."""
    z = torch.arange(start + 1, start + count + 1, dtype=torch.int64, device=DEV) * s64(GAMMA) + s64(seed)
    z = (z ^ srl(z, 30)) * s64(M1)
    z = (z ^ srl(z, 27)) * s64(M2)
    z = z ^ srl(z, 31)
    return srl(z, 11).double() * 2.0 ** -53 * 2 - 1


DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def make(inp, shape=None):
    """An input as kiln fills it (its dtype's values), returned in float32."""
    shape = shape or inp["shape"]
    n = math.prod(shape)
    if inp["dtype"] not in DTYPES:
        sys.exit(f"input '{inp['name']}' is {inp['dtype']}: this script makes f32, f16 and bf16 inputs only")
    dt = DTYPES[inp["dtype"]]
    out = torch.empty(n, dtype=torch.float32, device=DEV)
    if "constant" in inp:
        out.fill_(torch.tensor(inp["constant"], dtype=torch.float32).to(dt).float().item())
        return out.view(shape)
    chunk = 1 << 26
    for s in range(0, n, chunk):
        c = min(chunk, n - s)
        v = uniform(inp["seed"], s, c).float().to(dt)
        if inp["scale"] != 1:
            v = (v.double() * inp["scale"]).float().to(dt)
        out[s:s + c] = v.float()
    return out.view(shape)


def check_samples(name, t, samples):
    flat = t.reshape(-1)
    for sm in samples:
        got = flat[sm["index"]].item()
        if got != sm["value"]:
            sys.exit(f"the generator differs from kiln's: {name}[{sm['index']}] = {got!r}, kiln filled "
                     f"{sm['value']!r}; nothing compared")


def rmsnorm(x, g):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * g


class Model:
    """The model program's computation on given weights, in one dtype, with its own caches."""

    def __init__(self, w, cap, dtype):
        self.w = {k: v.to(dtype) for k, v in w.items()}
        self.L, qkv, self.H = w["w_qkv"].shape
        self.D = 128
        self.HQ = w["w_o"].shape[2] // self.D
        self.HKV = (qkv - self.HQ * self.D) // (2 * self.D)
        self.kc = torch.zeros(self.L, cap, self.HKV, self.D, device=DEV, dtype=dtype)
        self.vc = torch.zeros_like(self.kc)
        inv = 1.0 / (THETA ** (torch.arange(0, self.D, 2, device=DEV, dtype=torch.float64) / self.D))
        ang = torch.arange(cap, device=DEV, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], -1)
        self.cos, self.sin = ang.cos().float(), ang.sin().float()

    def rope(self, t, S, T):
        cos, sin = self.cos[S:S + T, None, :], self.sin[S:S + T, None, :]
        tf, h = t.float(), self.D // 2
        return (tf * cos + torch.cat([-tf[..., h:], tf[..., :h]], -1) * sin).to(t.dtype)

    def layer(self, l, x, S):
        w = {k: self.w[k][l] for k in ("g1", "w_qkv", "w_o", "g2", "w_gate", "w_up", "w_down")}
        T, D, HQ, HKV = x.shape[0], self.D, self.HQ, self.HKV
        qkv = rmsnorm(x, w["g1"]) @ w["w_qkv"].t()
        q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], -1)
        q = self.rope(q.reshape(T, HQ, D), S, T)
        self.kc[l, S:S + T] = self.rope(k.reshape(T, HKV, D), S, T)
        self.vc[l, S:S + T] = v.reshape(T, HKV, D)
        # query head h reads KV head h / (HQ / HKV); token t sees keys 0 .. S + t
        kk = self.kc[l, :S + T].repeat_interleave(HQ // HKV, dim=1).float()
        vv = self.vc[l, :S + T].repeat_interleave(HQ // HKV, dim=1).float()
        sc = torch.einsum("thd,shd->hts", q.float(), kk) / D ** 0.5
        seen = torch.arange(S + T, device=DEV)[None, :] <= (S + torch.arange(T, device=DEV))[:, None]
        p = torch.softmax(sc.masked_fill(~seen[None], float("-inf")), -1)
        a = torch.einsum("hts,shd->thd", p, vv).to(x.dtype).reshape(T, HQ * D)
        x2 = x + a @ w["w_o"].t()
        n2 = rmsnorm(x2, w["g2"])
        return x2 + (torch.nn.functional.silu(n2 @ w["w_gate"].t()) * (n2 @ w["w_up"].t())) @ w["w_down"].t()

    def __call__(self, x, S):
        h = x.to(self.kc.dtype)
        for l in range(self.L):
            h = self.layer(l, h, S)
        return (rmsnorm(h, self.w["g_final"]) @ self.w["w_lm"].t()).float()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--out")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    meta = json.load(open(os.path.join(a.dir, "meta.json")))
    ins = {i["name"]: i for i in meta["inputs"]}
    t0 = time.perf_counter()
    w = {}
    for name, inp in ins.items():
        if name == "x" or inp["state"]:
            continue
        w[name] = make(inp)
        check_samples(name, w[name], inp.get("samples", []))
    print(f"weights made in {time.perf_counter() - t0:.1f} s; kiln's sampled values reproduced exactly", flush=True)
    forms = {dtype: Model(w, meta["CAP"], dtype) for dtype in (torch.float32, torch.bfloat16)}
    V = w["w_lm"].shape[0]
    out_dtype = next(o["dtype"] for o in meta["outputs"] if o["name"] == "logits")
    # Each row's (token's) logits within this relative L2 error of float32: bf16's rounding
    # through the layers, or float32 against float32 summed in another order.
    bound = {"f32": 1e-4}.get(out_dtype, 3e-2)
    rows = []
    print(f"{'call':>4} {'T':>4} {'S':>4}  {'kiln vs f32':>12} {'(worst row)':>12}  {'torch bf16 vs f32':>17}  "
          f"{'top-1 kiln':>10} {'top-1 bf16':>10}")
    for k, call in enumerate(meta["calls"]):
        T, S = call["T"], call["S"]
        x = make(ins["x"] | {"seed": call["x_seed"]}, [T, ins["x"]["shape"][1]])
        check_samples("x", x, call["x_samples"])
        with torch.no_grad():
            out = {dtype: m(x, S) for dtype, m in forms.items()}
        raw = open(os.path.join(a.dir, call["outputs"]["logits"]["file"]), "rb").read()
        odt = DTYPES[out_dtype]
        kl = torch.frombuffer(bytearray(raw), dtype=odt).view(T, V).to(DEV).float()
        ref = out[torch.float32]

        def rel(y):
            return ((y - ref).norm() / ref.norm()).item()

        worst = max(((kl[r] - ref[r]).norm() / ref[r].norm()).item() for r in range(T))
        top_k = (kl.argmax(-1) == ref.argmax(-1)).float().mean().item()
        top_b = (out[torch.bfloat16].argmax(-1) == ref.argmax(-1)).float().mean().item()
        row = {"call": k, "T": T, "S": S, "kiln_rel_l2": rel(kl), "kiln_worst_row_rel_l2": worst,
               "torch_bf16_rel_l2": rel(out[torch.bfloat16]), "top1_kiln": top_k, "top1_torch_bf16": top_b,
               "finite": bool(torch.isfinite(kl).all().item())}
        rows.append(row)
        print(f"{k:>4} {T:>4} {S:>4}  {row['kiln_rel_l2']:>12.2e} {worst:>12.2e}  {row['torch_bf16_rel_l2']:>17.2e}  "
              f"{top_k:>10.3f} {top_b:>10.3f}", flush=True)
    # A NaN anywhere fails: every comparison with it is false.
    ok = all(r["finite"] and r["kiln_worst_row_rel_l2"] <= bound for r in rows)
    errs = [r["kiln_worst_row_rel_l2"] for r in rows]
    worst_all = float("nan") if any(e != e for e in errs) else max(errs)
    print(f"{'PASS' if ok else 'FAIL'}: the largest relative L2 error of a row of kiln's {out_dtype} logits against "
          f"float32 is {worst_all:.2e} (bound {bound:g}) over {len(rows)} calls")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "program": meta["program"],
                       "torch": torch.__version__, "rows": rows, "bound": bound, "pass": ok}, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
