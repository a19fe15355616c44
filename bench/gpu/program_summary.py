#!/usr/bin/env python3
"""The table of bench/gpu/program_mlp.sh: program_summary.py RESULTS_DIR"""
import json
import os
import re
import sys


def load(d, name):
    try:
        with open(os.path.join(d, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    d = sys.argv[1]
    t = load(d, "torch") or {"rows": [], "first_call_s": {}}
    bw = t.get("copy_bandwidth_GBps")
    wbytes = t.get("weights_bytes", 3 * 4096 * 14336 * 2)
    print(f"device: {t.get('device', '?')}; copy bandwidth {bw or 0:.0f} GB/s; the weights take "
          f"{wbytes / (bw * 1e9) * 1e6 if bw else 0:.1f} us to stream at it")
    print(f"{'T':>5} {'kiln ms':>9} {'eager':>9} {'compile':>9} {'max-aut.':>9} {'best/kiln':>9} {'kiln/stream':>11}"
          f" {'host us: kiln':>14} {'eager':>7} {'compile':>8} {'max-aut.':>8}")
    torch_rows = {r["T"]: r for r in t["rows"]}
    tokens = sorted(set(torch_rows) | {int(m.group(1)) for f in os.listdir(d)
                                       if (m := re.match(r"kiln_(\d+)\.json$", f))})
    for T in tokens:
        k = load(d, f"kiln_{T}")
        r = torch_rows.get(T, {})
        kms = k["call_ns"] / 1e6 if k else None
        others = [r.get(x + "_ms") for x in ("eager", "compile", "max-autotune")]
        best = min([o for o in others if o] or [0]) or None
        stream = (kms * 1e-3) / (wbytes / (bw * 1e9)) if kms and bw else None
        f = lambda v, w=9, p=4: f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"  # noqa: E731
        print(f"{T:>5} {f(kms)} {f(others[0])} {f(others[1])} {f(others[2])} {f(best / kms if best and kms else None, 9, 3)}"
              f" {f(stream, 11, 3)} {f(k['host_ns_per_call'] / 1e3 if k else None, 14, 1)}"
              f" {f(r.get('eager_host_us'), 7, 1)} {f(r.get('compile_host_us'), 8, 1)} {f(r.get('max-autotune_host_us'), 8, 1)}")
    print()
    for name in ("cold", "warm_64", "artifact_64", "nographs_64"):
        k = load(d, "kiln_" + name)
        if not k:
            continue
        print(f"kiln {name}: first call {k['first_call_s']:.3f} s, every step tuned {k['tuned_s']:.2f} s, "
              f"compiled {k['compiled']}, configs timed {k['configs_timed']}, host {k['host_ns_per_call'] / 1e3:.1f} us a call, "
              + (f" (the steps' handles alone: {k['host_ns_handles_only'] / 1e3:.1f} us)" if 'host_ns_handles_only' in k else "")
              + f", graphs replayed {k['graph_replays']}, steps: " + "; ".join(s["choice"] for s in k["steps"]))
    if t.get("first_call_s"):
        print("PyTorch first calls in this process (s): " +
              ", ".join(f"{n} {v:.1f}" for n, v in t["first_call_s"].items()))
    try:
        with open(os.path.join(d, "dispatch.txt")) as fh:
            lines = [x.strip() for x in fh if x.startswith(("raw", "LoadedKernel", "Kernel"))]
        print("dispatch (ns a launch): " + " | ".join(lines))
    except OSError:
        pass
    for T in tokens:
        k = load(d, f"kiln_{T}")
        if k:
            print(f"memory T={T}: intermediates {k['intermediate_bytes'] / 2**20:.2f} MiB, arena (peak) "
                  f"{k['arena_bytes'] / 2**20:.2f} MiB")
            break


if __name__ == "__main__":
    main()
