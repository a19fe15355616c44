#!/usr/bin/env python3
"""The table of bench/gpu/decoder.sh: decoder_summary.py RESULTS_DIR

Per (T, S): kiln's layer (calls back to back between two events, graphs replayed), its host
time a call and its check; PyTorch's forms timed the same way (torch.json); kiln against the
fastest PyTorch form (its time / kiln's: above 1, kiln is ahead). For T = 1 also the layer's
bytes (weights 436 MB plus the cache's S + 1 rows) over the copy bandwidth, against kiln's time.
"""
import glob
import json
import os
import sys

H, HQ, HKV, D, I = 4096, 32, 8, 128, 14336
WEIGHT_BYTES = 2 * (H * (HQ + 2 * HKV) * D + H * HQ * D + 3 * H * I)


def main():
    d = sys.argv[1]
    torch_rows, copy = {}, None
    tp = os.path.join(d, "torch.json")
    if os.path.exists(tp):
        try:
            t = json.load(open(tp))
            copy = t.get("copy_bandwidth_GBps")
            torch_rows = {(r["T"], r["S"]): r for r in t["rows"]}
        except ValueError:
            pass
    if copy:
        print(f"copy bandwidth {copy:.0f} GB/s (2N / t, 1 GiB); layer weights {WEIGHT_BYTES / 1e6:.0f} MB")
    print(f"{'T':>5} {'S':>6} {'kiln us':>9} {'host us':>8} {'first s':>8} {'check':>6} {'eager':>9} {'compile':>9} "
          f"{'reduce-oh':>9} {'best/kiln':>9} {'bytes/copy':>10}")
    pts = set(torch_rows)
    for p in glob.glob(os.path.join(d, "kiln_*.json")):
        T, S = (int(x) for x in os.path.basename(p)[5:-5].split("_"))
        pts.add((T, S))
    for T, S in sorted(pts):
        k = {}
        try:
            k = json.load(open(os.path.join(d, f"kiln_{T}_{S}.json")))
        except (OSError, ValueError):
            pass
        kus = k["call_ns"] / 1e3 if "call_ns" in k else None
        chk = k.get("check", {}).get("ok")
        chk = "-" if chk is None else ("ok" if chk else "FAIL")
        r = torch_rows.get((T, S), {})
        forms = {f: r.get(f + "_b2b_ms") for f in ("eager", "compile", "reduce-overhead")}
        best = min((v for v in forms.values() if v), default=None)
        cell = lambda v: f"{v * 1e3:9.1f}" if v else f"{'-':>9}"
        ratio = f"{best * 1e3 / kus:8.2f}x" if best and kus else f"{'-':>9}"
        roof = ""
        if T == 1 and copy and kus:
            bytes_ = WEIGHT_BYTES + 2 * (S + 1) * HKV * D * 2
            roof = f"{bytes_ / copy / 1e3 / kus * 100:9.1f}%"
        print(f"{T:>5} {S:>6} " + (f"{kus:9.1f} {k['host_ns_per_call'] / 1e3:8.1f} {k['first_call_s']:8.1f}" if kus else
                                   f"{'-':>9} {'-':>8} {'-':>8}")
              + f" {chk:>6} {cell(forms['eager'])} {cell(forms['compile'])} {cell(forms['reduce-overhead'])} {ratio} {roof:>10}")


if __name__ == "__main__":
    main()
