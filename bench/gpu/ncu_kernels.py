"""Every kernel an Nsight Compute CSV (metrics gpu__time_duration.sum, dram__bytes_read.sum,
dram__bytes_write.sum) holds, in launch order: its time, its DRAM bytes and the time those
take at the copy bandwidth; then the total. Usage: python3 ncu_kernels.py NCU.csv [copy_bandwidth.txt]"""
import csv, re, sys
bw = None
if len(sys.argv) > 2:
    try:
        bw = float(re.search(r"copy bandwidth (\d+)", open(sys.argv[2]).read()).group(1)) * 1e9
    except Exception:
        pass
text = open(sys.argv[1]).read().splitlines()
start = next((i for i, l in enumerate(text) if l.startswith('"ID"')), None)
if start is None:
    print("no kernels in", sys.argv[1]); sys.exit(1)
rows, order = {}, []
for row in csv.DictReader(text[start:]):
    k = row["ID"]
    if k not in rows:
        rows[k] = {"name": row["Kernel Name"], "grid": row["Grid Size"], "block": row["Block Size"]}
        order.append(k)
    rows[k][row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
tot = ideal_tot = 0
for k in order:
    d = rows[k]
    t = d.get("gpu__time_duration.sum", 0) / 1e3
    by = d.get("dram__bytes_read.sum", 0) + d.get("dram__bytes_write.sum", 0)
    ideal = by / bw * 1e6 if bw else 0
    tot += t; ideal_tot += ideal
    print(f"{k:>5} {d['name'][:60]:60} {d['grid']:>14} {t:9.2f} us {by / 1e6:9.2f} MB {ideal:8.2f} us")
print(f"{len(order)} kernels: {tot:.1f} us alone, their bytes at the copy bandwidth {ideal_tot:.1f} us")
