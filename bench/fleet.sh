#!/usr/bin/env bash
# Sharing figures, each a fresh process on an empty local cache, one run:
#   1. time to first launch (kiln_bench_first_call, the built-in cpu matmul)
#      with a warm Redis against no remote cache;
#   2. the added time of a lookup while Redis is down (kiln_bench_remote_down);
#   3. time to load a packed artifact of the built-in cpu kernels and run
#      their packed shapes (examples/matmul_app built against an install)
#      against packing them cold (compiling and tuning every shape).
# Usage: bench/fleet.sh [build folder] [M=N=K for 1, default 384]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
S=${2:-384}
tmp=$(mktemp -d /tmp/kiln-fleet-XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --loglevel warning >/dev/null &
rpid=$!
trap 'kill $rpid 2>/dev/null; rm -rf "$tmp"' EXIT
sleep 0.5
url="redis://127.0.0.1:$port/0"
first() { "$B/bench/kiln_bench_first_call" kernels/cpu/matmul.toml --set M=$S --set N=$S --set K=$S | awk '{print $1}'; }
export KILN_LOG=error
cold=$(KILN_CACHE_DIR=$tmp/a first)
fill=$(KILN_CACHE_DIR=$tmp/b KILN_REMOTE_CACHE=$url first)
remote=$(KILN_CACHE_DIR=$tmp/c KILN_REMOTE_CACHE=$url first)
local=$(KILN_CACHE_DIR=$tmp/a first)
echo "1. first launch of matmul at M=N=K=$S in a fresh process, seconds"
printf "   %-44s %8.3f\n" "empty local cache, no remote (tunes)" "$cold" \
  "empty local cache, Redis empty (tunes, fills it)" "$fill" \
  "empty local cache, Redis warm" "$remote" "warm local cache" "$local"
python3 -c "print('   Redis warm / no remote: %.4f   (%.0fx faster)' % ($remote/$cold, $cold/$remote))"
echo
echo "2. lookups while Redis is down"
"$B/bench/kiln_bench_remote_down" 2>/dev/null | sed 's/^/   /'
echo
echo "3. the built-in cpu kernels (matmul, softmax) at their size hints"
cmake --install "$B" --prefix "$tmp/prefix" >/dev/null
cmake -S examples/matmul_app -B "$tmp/app" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null && cmake --build "$tmp/app" >/dev/null
t0=$(date +%s.%N)
KILN_CACHE_DIR=$tmp/p "$B/kiln" -q pack kernels/cpu/matmul.toml kernels/cpu/softmax.toml --hints -o "$tmp/app.kiln" >/dev/null 2>&1
t1=$(date +%s.%N)
KILN_CACHE_DIR=$tmp/q "$tmp/app/matmul_app" "$tmp/app.kiln" > "$tmp/app.out"
t2=$(date +%s.%N)
python3 - "$t0" "$t1" "$t2" <<'PY'
import sys
t0, t1, t2 = map(float, sys.argv[1:])
print("   %-44s %8.3f" % ("tuning them cold (kiln pack, empty caches)", t1 - t0))
print("   %-44s %8.3f" % ("loading the artifact, running matmul's shapes", t2 - t1))
print("   load / tune cold: %.4f (%.0fx faster)" % ((t2 - t1) / (t1 - t0), (t1 - t0) / (t2 - t1)))
PY
sed 's/^/   /' "$tmp/app.out" | tail -1
