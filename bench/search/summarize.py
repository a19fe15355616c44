"""One line of bench/search/run.sh's table from the quick and the full kiln tune
--json outputs; with a fixture folder, writes the full record's times there."""
import json
import os
import platform
import sys

spec, shape, quick_path, full_path = sys.argv[1:5]
fixture_dir = sys.argv[5] if len(sys.argv) > 5 else ""
q, f = json.load(open(quick_path)), json.load(open(full_path))


def key(params):
    return json.dumps(params, sort_keys=True)


times = {key(c["params"]): c["ns"] for c in f["configs"] if c["ns"]}
runnable = [c for c in f["configs"] if c["result"] not in ("pruned", "unavailable") and c["params"]]
quick_ns = times.get(key(q["best"]), q["best_ns"])
print("%-18s %7d %9d %6d (%3.0f%%) %9.1f %9.1f %10.1f %10.1f %7.3fx" % (
    shape, f["space_size"], len(runnable), q["timed_now"], 100.0 * q["timed_now"] / max(1, len(runnable)),
    q["seconds"], q["seconds"] + f["seconds"], quick_ns / 1e3, f["best_ns"] / 1e3, quick_ns / f["best_ns"]))
print("  quick: %s" % q["start"])
if fixture_dir:
    os.makedirs(fixture_dir, exist_ok=True)
    out = {
        "what": "every runnable config of a kernel timed at one shape (kiln tune --effort full after --effort quick, one cache)",
        "spec": spec,
        "kernel": f["kernel"],
        "key": f["key"],
        "method": "exhaustive",
        "shape": dict(zip(["M", "N", "K"], map(int, shape.split("x")))),
        "device": f["device"],
        "machine": platform.machine(),
        "when": f["when"],
        "space_size": f["space_size"],
        "best": f["best"],
        "best_ns": f["best_ns"],
        "quick": {"best": q["best"], "best_ns_in_full": quick_ns, "timed": q["timed_now"], "start": q["start"]},
        "configs": [{"params": c["params"], "ns": c["ns"], "result": c["result"]} for c in runnable],
    }
    name = "%s-%s.json" % (os.path.basename(spec).rsplit(".", 1)[0], shape)
    with open(os.path.join(fixture_dir, name), "w") as fh:
        json.dump(out, fh, separators=(",", ":"), sort_keys=True)
        fh.write("\n")
    print("  fixture: %s" % os.path.join(fixture_dir, name))
