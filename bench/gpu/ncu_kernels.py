"""Every kernel an Nsight Compute CSV (metrics gpu__time_duration.sum, dram__bytes_read.sum,
dram__bytes_write.sum) holds, in launch order: its time, its DRAM bytes and the time those
take at the copy bandwidth; then the total. Usage: python3 ncu_kernels.py NCU.csv [copy_bandwidth.txt]
read_ncu and copy_bandwidth are also layer_profile.py's."""
import csv, re, sys


def copy_bandwidth(path):
    """The bytes/s a copy_bandwidth.txt ("copy bandwidth N GB/s") says, or None."""
    try:
        return float(re.search(r"copy bandwidth (\d+)", open(path).read()).group(1)) * 1e9
    except Exception:
        return None


def read_ncu(path):
    """(rows, order): each kernel's name, grid, block and metrics by its ID, and the IDs in launch
    order; (None, None) where the CSV holds no kernel."""
    text = open(path).read().splitlines()
    start = next((i for i, l in enumerate(text) if l.startswith('"ID"')), None)
    if start is None:
        return None, None
    rows, order = {}, []
    for row in csv.DictReader(text[start:]):
        k = row["ID"]
        if k not in rows:
            rows[k] = {"name": row["Kernel Name"], "grid": row["Grid Size"], "block": row["Block Size"]}
            order.append(k)
        rows[k][row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    return rows, order


if __name__ == "__main__":
    bw = copy_bandwidth(sys.argv[2]) if len(sys.argv) > 2 else None
    rows, order = read_ncu(sys.argv[1])
    if rows is None:
        print("no kernels in", sys.argv[1]); sys.exit(1)
    tot = ideal_tot = 0
    for k in order:
        d = rows[k]
        t = d.get("gpu__time_duration.sum", 0) / 1e3
        by = d.get("dram__bytes_read.sum", 0) + d.get("dram__bytes_write.sum", 0)
        ideal = by / bw * 1e6 if bw else 0
        tot += t; ideal_tot += ideal
        print(f"{k:>5} {d['name'][:60]:60} {d['grid']:>14} {t:9.2f} us {by / 1e6:9.2f} MB {ideal:8.2f} us")
    print(f"{len(order)} kernels: {tot:.1f} us alone, their bytes at the copy bandwidth {ideal_tot:.1f} us")
