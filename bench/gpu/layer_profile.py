"""Summary of bench/gpu/layer_profile.sh: every kernel Nsight Compute timed (in launch order),
its DRAM bytes and the time those bytes take at the copy bandwidth of the same run; then the
last whole call's kernels (the run's last kernels, as many as a call launches: PER_CALL, else
found as the period of the kernel names) against the call's time back to back. Usage: python3 layer_profile.py <results dir>"""
import json, os, re, sys
from ncu_kernels import copy_bandwidth, read_ncu
r = sys.argv[1]
bw = copy_bandwidth(os.path.join(r, "copy_bandwidth.txt"))
rows, order = read_ncu(os.path.join(r, "ncu.csv"))
if rows is None:
    print("no kernels in ncu.csv"); sys.exit(1)
tuned = json.load(open(os.path.join(r, "tuned.json")))
steps = len(tuned.get("steps", []))
print(f"copy bandwidth {bw / 1e9:.0f} GB/s; whole call back to back {tuned['call_ns'] / 1e3:.1f} us; "
      f"{len(order)} kernels profiled; the program has {steps} steps")
def line(k):
    d = rows[k]
    t = d.get("gpu__time_duration.sum", 0) / 1e3
    by = d.get("dram__bytes_read.sum", 0) + d.get("dram__bytes_write.sum", 0)
    ideal = by / bw * 1e6 if bw else 0
    name = re.sub(r"\(.*", "", d["name"])[:40]
    return t, ideal, f"{k:>5} {name:40} {d['grid']:>14} {d['block']:>12} {t:9.2f} us {by / 1e6:9.2f} MB {ideal:8.2f} us {100 * ideal / t if t else 0:6.1f}%"
print(f"{'id':>5} {'kernel':40} {'grid':>14} {'block':>12} {'time':>12} {'DRAM':>12} {'at copy bw':>11} {'of bw':>7}")
for k in order:
    print(line(k)[2])
# A call's kernels: PER_CALL, else the shortest period of the run's last kernels (the last
# two whole calls launch the same kernels in the same order).
names = [re.sub(r"\(.*", "", rows[k]["name"]) + rows[k]["grid"] for k in order]
n = int(os.environ.get("PER_CALL", "0")) or next(
    (p for p in range(1, len(names) // 2 + 1) if names[-p:] == names[-2 * p:-p]), None)
if n:
    last = order[-n:]
    tot = sum(line(k)[0] for k in last); ideal = sum(line(k)[1] for k in last)
    print(f"last call ({n} kernels): {tot:.1f} us of kernels alone, their bytes at copy bw {ideal:.1f} us; "
          f"whole call {tuned['call_ns'] / 1e3:.1f} us, {tuned['call_ns'] / 1e3 - tot:+.1f} us against the kernels alone "
          f"(negative: launched to overlap, the kernels hide part of each other's time)")
