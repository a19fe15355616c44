#!/usr/bin/env python3
"""The table of bench/gpu/mlp_peers.sh: kiln's MLP block against each PyTorch form,
all as whole calls back to back between two events; the fastest form is the peer.
  mlp_peers_summary.py DIR"""
import json
import os
import sys


def main():
    d = sys.argv[1]
    torch = json.load(open(os.path.join(d, "torch.json")))
    print(f"device: {open(os.path.join(d, 'machine.txt')).read().strip()}; torch {torch['torch']}")
    forms = [k[:-7] for k in torch["rows"][0] if k.endswith("_b2b_ms")]
    print("| T | kiln us | " + " | ".join(f"{f} us" for f in forms) + " | fastest peer | kiln vs fastest | kiln check |")
    print("|---|---|" + "---|" * len(forms) + "---|---|---|")
    for row in torch["rows"]:
        t = row["T"]
        try:
            k = json.load(open(os.path.join(d, f"kiln_{t}.json")))["call_ns"] / 1e3
        except (OSError, ValueError, KeyError):
            k = None
        chk = "?"
        p = os.path.join(d, f"check_{t}.txt")
        if os.path.exists(p):
            text = open(p).read()
            chk = "passed" if "check passed" in text else "FAILED"
        best = min(forms, key=lambda f: row[f + "_b2b_ms"])
        b = row[best + "_b2b_ms"] * 1e3
        print(f"| {t} | {'-' if k is None else f'{k:.1f}'} | " + " | ".join(f"{row[f + '_b2b_ms'] * 1e3:.1f}" for f in forms)
              + f" | {best} | {'-' if k is None else f'{b / k:.3f}x'} | {chk} |")


if __name__ == "__main__":
    main()
