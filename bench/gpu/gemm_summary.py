#!/usr/bin/env python3
"""The table of bench/gpu/gemm_side_by_side.sh: gemm_summary.py RESULTS_DIR

Per shape, ms: kiln's tuned choice, its best template (of what it timed), cuBLASLt's
own first choice as kiln timed it (#0), torch.mm and torch.compile; ratios against
cuBLAS (kiln's timing of cuBLASLt #0) and against PyTorch (its timing). Then the
gated GEMM against eager silu(x Wg^T) * (x Wu^T), and the decode shapes' bandwidth.
"""
import json
import os
import sys


def load(d, name):
    p = os.path.join(d, name + ".json")
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def times(rec):
    """(best ns, best template ns, cuBLASLt #0 ns, best config) of a kiln tune --json record."""
    if not rec:
        return None, None, None, None
    best = rec.get("best_ns")
    tmpl = [c["ns"] for c in rec["configs"] if c.get("ns") and "library" not in c["params"]]
    lib0 = [c["ns"] for c in rec["configs"] if c.get("ns") and c["params"].get("library", "").endswith("#0")]
    return best, min(tmpl) if tmpl else None, lib0[0] if lib0 else None, rec.get("best")


def fmt(x, w=9, p=4):
    return f"{x:>{w}.{p}f}" if isinstance(x, (int, float)) else f"{'-':>{w}}"


def main():
    d = sys.argv[1]
    torch_res = load(d, "torch") or {"rows": [], "gated": []}
    bw = torch_res.get("copy_bandwidth_GBps")
    print(f"device: {torch_res.get('device', '?')}; copy bandwidth {bw or 0:.0f} GB/s (1 GiB device-to-device, read + write)")
    print(f"{'shape':<22}{'kiln':>9}{'tmpl':>9}{'cuBLASLt':>9}{'torch.mm':>9}{'compile':>9}"
          f"{'kiln/cuB':>9}{'tmpl/cuB':>9}{'kiln/mm':>9}{'kiln/tc':>9}  choice")
    worst = {}
    for r in torch_res["rows"] or [{"kind": k, "M": m, "N": n, "K": kk, "torch_mm_ms": None, "compile_ms": None}
                                    for k, m, n, kk in []]:
        kind, m, n, k = r["kind"], r["M"], r["N"], r["K"]
        tag = f"{kind}_{m}_{n}_{k}"
        b1, t1, l1, c1 = times(load(d, "kiln_" + tag))
        b2, t2, l2, c2 = times(load(d, "decode_" + tag))
        b3, t3, l3, c3 = times(load(d, "wgmma_" + tag))
        cands = [(b, c) for b, c in ((b1, c1), (b2, c2), (b3, c3)) if b]
        kiln_ns, choice = min(cands, key=lambda x: x[0]) if cands else (None, None)
        tmpl = min([x for x in (t1, t2, t3) if x] or [None]) if (t1 or t2 or t3) else None
        if kind == "square" and m in (4096, 8192):
            fb, _, _, _ = times(load(d, f"full_square_{m}"))
            tmpl = min(x for x in (tmpl, fb) if x) if (tmpl or fb) else None
        lib = l3 or l1 or l2
        ms = lambda ns: ns / 1e6 if ns else None  # noqa: E731
        kiln_ms, tmpl_ms, lib_ms = ms(kiln_ns), ms(tmpl), ms(lib)
        mm, tc = r.get("torch_mm_ms"), r.get("compile_ms")
        ratio = lambda a, b: a / b if a and b else None  # noqa: E731
        row = [ratio(kiln_ms, lib_ms), ratio(tmpl_ms, lib_ms), ratio(kiln_ms, mm), ratio(kiln_ms, tc)]
        for name, v in zip(["kiln/cuBLASLt", "templates/cuBLASLt", "kiln/torch.mm", "kiln/torch.compile"], row):
            if v:
                worst[name] = max(worst.get(name, 0), v)
        label = f"{kind} {m}x{n}x{k}"
        cs = json.dumps(choice, separators=(",", ":")) if choice else "-"
        print(f"{label:<22}{fmt(kiln_ms)}{fmt(tmpl_ms)}{fmt(lib_ms)}{fmt(mm)}{fmt(tc)}"
              + "".join(fmt(v, 9, 3) for v in row) + f"  {cs[:60]}")
    print("worst ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in worst.items()))
    print()
    print(f"{'gated T':<10}{'kiln fused':>11}{'eager sep.':>11}{'speed-up':>9}  choice")
    for g in torch_res.get("gated", []):
        t = g["T"]
        b1, _, _, c1 = times(load(d, f"gated_{t}"))
        b2, _, _, c2 = times(load(d, f"gated_decode_{t}"))
        b3, _, _, c3 = times(load(d, f"gated_wgmma_{t}"))
        cands = [(b, c) for b, c in ((b1, c1), (b2, c2), (b3, c3)) if b]
        if not cands:
            continue
        ns, c = min(cands, key=lambda x: x[0])
        print(f"{t:<10}{ns / 1e6:>11.4f}{g['separate_ms']:>11.4f}{g['separate_ms'] / (ns / 1e6):>9.3f}  "
              f"{json.dumps(c, separators=(',', ':'))[:60]}")
    print()
    if bw:
        print("decode shapes: weight bytes streamed / kiln's time, against the copy bandwidth")
        for r in torch_res["rows"]:
            if r["M"] > 16:
                continue
            tag = f"{r['kind']}_{r['M']}_{r['N']}_{r['K']}"
            cands = [x for x in (times(load(d, "kiln_" + tag))[0], times(load(d, "decode_" + tag))[0],
                                 times(load(d, "wgmma_" + tag))[0]) if x]
            if not cands:
                continue
            ns = min(cands)
            gbps = r["N"] * r["K"] * 2 / ns
            print(f"  {r['kind']} T={r['M']}: {gbps:.0f} GB/s = {gbps / bw:.1%} of the copy bandwidth "
                  f"(torch.mm: {r['N'] * r['K'] * 2 / (r['torch_mm_ms'] * 1e6):.0f} GB/s)")


if __name__ == "__main__":
    main()
