#!/usr/bin/env python3
"""Where a kernel's warps stall, by instruction: ncu_sass_summary.py SASS.csv [--units N] [--top K]

SASS.csv is Nsight Compute's source page of one profiled launch, as CSV with the SASS
(`ncu -i REPORT --page source --print-source sass --csv`; bench/gpu/attn_prefill_profile.sh
writes one). Prints the warp-stall samples by reason (share of all samples), the instructions
executed by opcode (divided by --units, e.g. the warp-tiles of the launch, to read as
"instructions a unit of work"), and the --top instructions with the most stall samples and
their three main reasons.
"""
import argparse
import collections
import csv
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--units", type=float, default=1.0, help="divide instruction counts by this")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args()
    rows = list(csv.reader(open(a.csv, newline="")))
    # the first row names the kernel, the next holds the columns; ncu's own messages (the file
    # may hold its stderr) and rows of another shape are left out
    head = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head is None:
        sys.exit(f"{a.csv}: no SASS table (no row starts with Address): did ncu write it?")
    hdr = rows[head]
    data = [r for r in rows[head + 1:] if len(r) == len(hdr) and r[0].startswith("0x")]
    col = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, name):
        try:
            return int(float(r[col[name]].replace(",", "")))
        except (ValueError, IndexError, KeyError):
            return 0

    total = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data) or 1
    by_reason = collections.Counter()
    by_op = collections.Counter()
    for r in data:
        for s in stalls:
            by_reason[s[6:]] += num(r, s)
        ins = r[col["Source"]].strip()
        if ins.startswith("@"):
            ins = ins.split(None, 1)[1]
        if ins:
            by_op[ins.split()[0]] += num(r, "Instructions Executed")
    print(f"{rows[0][1] if len(rows[0]) > 1 else ''}: {total} stall samples")
    for s, v in by_reason.most_common(12):
        print(f"  {s:22s} {100 * v / total:5.1f}%")
    n = sum(by_op.values())
    print(f"instructions executed: {n} ({n / a.units:.1f} a unit)")
    for op, v in by_op.most_common(25):
        print(f"  {op:32s} {v / a.units:10.1f}")
    print(f"top {a.top} instructions by stall samples:")
    top = sorted(data, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))[: a.top]
    for r in top:
        smp = num(r, "Warp Stall Sampling (All Samples)")
        why = sorted(((num(r, s), s[6:]) for s in stalls), reverse=True)[:3]
        print(f"  {r[col['Address']][-5:]} {100 * smp / total:5.1f}% {r[col['Source']].strip()[:58]:58s} "
              + ", ".join(f"{w} {c}" for c, w in why if c))


if __name__ == "__main__":
    main()
