#!/usr/bin/env bash
# The cpu linear family's fused templates against OpenBLAS's unfused form of the same
# problem (the GEMM, two for the gated MLP, and the epilogue as passes beside it), both
# timed by one `kiln tune` of the member, the same way (calls timed back to back in the
# benchmark worker): per member and row count M, the best fused template's time, the
# unfused form's, their ratio, and what the tuning chose. A ratio above 1 is where the
# fused template alone would have been the slower choice.
# Usage: bench/cpu/fused_vs_unfused.sh [build dir] [N] [K]   (a fresh cache each run)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
N=${2:-1408}
K=${3:-512}
export KILN_CACHE_DIR=$(mktemp -d /tmp/kiln-unfused-XXXXXX)
trap 'rm -rf "$KILN_CACHE_DIR"' EXIT
printf "%-18s %5s %14s %14s %16s  %s\n" member M "fused (us)" "unfused (us)" "fused/unfused" chosen
for member in f32_nt_gated f32_nt_residual f32_nt_bias_gelu; do
  for M in 1 8 32 256; do
    "$B/kiln" -q tune --json "kernels/cpu/linear.toml:$member" --set M=$M --set N=$N --set K=$K 2>/dev/null |
      python3 -c '
import json, sys
d = json.load(sys.stdin)
t = [c["ns"] for c in d["configs"] if c.get("ns") and "library" not in c["params"]]
u = [c["ns"] for c in d["configs"] if c.get("ns") and "library" in c["params"]]
ch = d["best"]
ch = ch.get("library") or " ".join(f"{k}={v}" for k, v in ch.items())
f, g = min(t) / 1e3, (u[0] / 1e3 if u else float("nan"))
print(f"{sys.argv[1]:<18} {sys.argv[2]:>5} {f:14.1f} {g:14.1f} {f / g:16.2f}  {ch}")
' "$member" "$M"
  done
done
