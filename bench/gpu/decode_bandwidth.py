#!/usr/bin/env python3
"""Summary of bench/gpu/decode_bandwidth.sh: per decode shape, the best config (of those
that passed every correctness shape) by back-to-back bandwidth, the default config of
kernels/cuda/gemm_decode.toml and cuBLAS, each as a share of the copy bandwidth."""
import pathlib
import re
import sys

d = pathlib.Path(sys.argv[1])
row = re.compile(r"M=(\d+)\s+N=(\d+)\s+K=(\d+)\s+ring\s+(\d+) \| b2b: kernel\s+([\d.]+) ms\s+(\d+) GB/s =\s+([\d.]+)% of copy, "
                 r"cuBLAS\s+(\d+) GB/s =\s+([\d.]+)% \| flush: kernel\s+([\d.]+) ms\s+(\d+) GB/s =\s+([\d.]+)%, "
                 r"cuBLAS\s+(\d+) GB/s =\s+([\d.]+)%")
default = "rg1_w8_u4_mt1_p1_pf1_ks1"
copy = None
res = {}  # shape -> {config: (b2b%, flush%, cublas b2b%, cublas flush%)}
failed, passed = [], []
for f in sorted(d.glob("*.txt")):
    if f.name in ("summary.txt", "machine.txt") or f.name.endswith(".build.txt"):
        continue
    text = f.read_text()
    m = re.search(r"(\d+) passed, (\d+) failed", text)
    if not m or m.group(2) != "0":
        failed.append(f.stem)
        continue
    passed.append(f.stem)
    c = re.search(r"copy: (\d+) GB/s", text)
    if c:
        copy = copy or c.group(1)
    for r in row.finditer(text):
        shape = tuple(int(x) for x in r.group(1, 2, 3))
        res.setdefault(shape, {})[f.stem] = (float(r.group(7)), float(r.group(12)), float(r.group(9)), float(r.group(14)))
machine = (d / "machine.txt").read_text().strip() if (d / "machine.txt").exists() else "?"
print(f"device: {machine}; copy bandwidth {copy} GB/s (first config's run)")
print(f"configs that passed the check: {len(passed)}; "
      f"failed or did not run: {', '.join(failed) or 'none'}")
print(f"{'M x N x K':>18}  {'best b2b':>8} {'its flush':>9}  {'best config':<22} {'default b2b':>11}  {'cuBLAS b2b':>10} {'flush':>6}")
for shape in sorted(res, key=lambda s: (s[1] * s[2], s[0])):
    cfgs = res[shape]
    best = max(cfgs, key=lambda k: cfgs[k][0])
    cub = max(v[2] for v in cfgs.values()), max(v[3] for v in cfgs.values())
    dflt = f"{cfgs[default][0]:10.1f}%" if default in cfgs else "        n/a"
    print(f"{'x'.join(map(str, shape)):>18}  {cfgs[best][0]:7.1f}% {cfgs[best][1]:8.1f}%  {best:<22} {dflt}  {cub[0]:9.1f}% {cub[1]:5.1f}%")
print("(% of the copy bandwidth: weight bytes / time over 2 x bytes copied / time; cuBLAS: the best of its runs beside each config)")


def best_where(cfgs, has):
    v = [x[0] for k, x in cfgs.items() if has(k)]
    return f"{max(v):7.1f}" if v else "    n/a"


print("\nper shape, the best config with each value of a param (% of copy, back to back):")
print(f"{'M x N x K':>18} {'L2PF=0':>7} {'L2PF=1':>7} | {'PIPE=1':>7} {'PIPE=2':>7} | {'KSPLIT=1':>8} {'2':>7} {'4':>7}")
for shape in sorted(res, key=lambda s: (s[1] * s[2], s[0])):
    c = res[shape]
    cols = [best_where(c, lambda k, t=t: t in k + "_") for t in ("_pf0_", "_pf1_", "_p1_", "_p2_")]
    ks = [best_where(c, lambda k, t=t: k.endswith(t)) for t in ("_ks1", "_ks2", "_ks4")]
    print(f"{'x'.join(map(str, shape)):>18} {cols[0]} {cols[1]} | {cols[2]} {cols[3]} | {ks[0]:>8} {ks[1]} {ks[2]}")
