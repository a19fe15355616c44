#!/usr/bin/env bash
# Does a config timed in a worker process take as long as the same config timed in this
# process? A multi-kernel times its single-launch variants in a worker and its variants of
# several launches here, then compares them. `kiln tune` of SPEC at SETS from an empty tuning
# cache, once each of RUNS (by default KILN_TUNE_IN_PROCESS=1, every config timed in the process,
# then the default, workers; the runs after the first start from its compiled binaries, not its
# records); each run's record of every spec it tuned, fastest configs first.
# Usage (GPU machine): bench/gpu/where_timed.sh [build dir]
#   SPEC (default kernels/cuda/linear_residual_bf16_nt.toml), SETS (default "M=1024 N=4096 K=14336"),
#   RUNS (default "B:1 B:0"): the runs in turn, each a build folder (B: the script's) and the
#   KILN_TUNE_IN_PROCESS it runs with (another build folder compares two builds of kiln)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
SPEC=${SPEC:-kernels/cuda/linear_residual_bf16_nt.toml}
SETS=${SETS:-"M=1024 N=4096 K=14336"}
args=(); for s in $SETS; do args+=(--set "$s"); done
first=""
RUNS=${RUNS:-"B:1 B:0"}
for run in $RUNS; do
  bdir=${run%:*} mode=${run#*:}
  [ "$bdir" = B ] && bdir=$B
  d=$(mktemp -d /tmp/kiln-where-XXXXXX)
  # the second run starts from the first's compiled binaries, without its records
  if [ -n "$first" ]; then cp -r "$first/." "$d/" && rm -rf "$d/tune"; fi
  first=$d
  t0=$(date +%s)
  tag=$(basename "$bdir")_$mode
  LD_LIBRARY_PATH=$PWD/$bdir/lib:$LD_LIBRARY_PATH KILN_CACHE_DIR=$d KILN_TUNE_IN_PROCESS=$mode timeout ${STEP_TIMEOUT:-200} \
    "$bdir/kiln" -q tune --json "$SPEC" "${args[@]}" > "$OUTD/where_$tag.json" 2> "$OUTD/where_$tag.err"
  echo "$bdir/kiln, KILN_TUNE_IN_PROCESS=$mode: exit code $? in $(($(date +%s) - t0)) s"
  python3 - "$d" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/tune/*/*.rec")):
    t = open(f).read(); j = json.loads(t[t.index("{"):])
    oks = sorted((c for c in j["configs"] if c.get("kind") == "ok"), key=lambda c: c["ns"])
    print(f"  {j['kernel']} {j['key']}: best {j.get('best')}")
    for c in oks[:4]:
        print(f"     {c['ns'] / 1e3:8.1f} us (min {c['min_ns'] / 1e3:8.1f})  {c['params']}")
PY
done
