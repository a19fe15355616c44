#!/usr/bin/python3
"""Best-so-far against configs timed: a budgeted search beside the exhaustive one.

Input: pairs of `kiln tune --json` outputs at one shape, made on one cache:
first `--effort quick` (a budgeted search), then `--effort full` (which times
what the quick one left). The exhaustive curve walks the full record's
configs in space order; the budgeted curve walks the quick run's
`evaluated` list in the order it timed them. Both are divided by the best
time in the full record.

Usage: bench/plot_search.py OUT.png QUICK.json FULL.json [QUICK.json FULL.json ...]
Needs matplotlib (Debian: python3-matplotlib).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def name(params):
    if "library" in params:
        return "library:" + params["library"]
    return " ".join(sorted(f"{k}={v}" for k, v in params.items()))


def norm(text):
    return text if text.startswith("library:") else " ".join(sorted(text.split()))


def curve(order, times, best):
    out, cur = [], float("inf")
    for c in order:
        t = times.get(c)
        if t is not None:
            cur = min(cur, t)
        out.append(cur / best if cur != float("inf") else None)
    return out


def main():
    if len(sys.argv) < 4 or len(sys.argv) % 2 != 0:
        sys.exit(__doc__)
    out = sys.argv[1]
    pairs = [(sys.argv[i], sys.argv[i + 1]) for i in range(2, len(sys.argv), 2)]
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 3.6), squeeze=False)
    for ax, (qf, ff) in zip(axes[0], pairs):
        q, f = json.load(open(qf)), json.load(open(ff))
        times = {name(c["params"]): c["ns"] for c in f["configs"] if c["ns"] is not None}
        best = min(times.values())
        space = [name(c["params"]) for c in f["configs"] if c["result"] != "pruned"]
        ex = curve(space, times, best)
        bq = curve([norm(c) for c in q["evaluated"]], times, best)
        ax.plot(range(1, len(ex) + 1), ex, label=f"exhaustive ({len(ex)} timed)", color="0.5")
        ax.plot(range(1, len(bq) + 1), bq, label=f"budgeted ({len(bq)} timed)", color="C3", linewidth=2)
        ax.axhline(1.02, color="C2", linestyle=":", linewidth=1, label="1.02x of the best")
        ax.set_yscale("log")
        ax.set_ylim(0.98, max(2.0, min(20, max(v for v in ex + bq if v))))
        k = q["key"]
        names = [n for n in ("M", "N", "K") if n in k] or list(k)
        ax.set_title(" ".join(f"{n}={k[n]}" for n in names), fontsize=10)
        ax.set_xlabel("configs timed")
        ax.set_ylabel("best so far / exhaustive best")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
