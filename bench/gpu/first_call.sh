#!/usr/bin/env bash
# The first call in a fresh process (issue 19), on the GPU machine:
#   1. the floor: an empty kernel's first call, cold (empty caches) and warm;
#   2. kiln's matmuls (fp32, and the bf16 linear layer) at several shapes:
#      cold (empty caches; KILN_FIRST_CALL=swap: a safe choice at once, the
#      shape tuned behind it) with the time until the tuned choice is in use,
#      then warm (a fresh process, records and binaries cached);
#      and, for two shapes, the quick choice's time over the best of an
#      exhaustive tuning of the same shape (kiln tune --effort full);
#   3. Inductor's first call of the same products in a fresh process, cold
#      (a fresh TORCHINDUCTOR_CACHE_DIR) and warm, max-autotune;
#   4. 100 distinct tuned kernels in one fresh process against the floor;
#   5. compiling the cuda matmul space cold: NVRTC in threads against NVRTC in
#      kiln-worker processes.
# Every time is the whole process's wall time (started to exited) unless
# the column says "in-process" (from main() to the first result, synchronised).
# Usage (GPU machine, with build-gpu-carry from scripts/gpu-carry.sh):
#   bench/gpu/first_call.sh [build dir] [parts: floor,kiln,inductor,many,compile]
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu-carry}
PARTS=${2:-floor,kiln,inductor,many,compile}
R=${OUT:-/tmp/kiln-gpu-out}/first_call
mkdir -p "$R"
work=$(mktemp -d /tmp/kiln-fc-XXXXXX)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
has() { [[ ",$PARTS," == *",$1,"* ]]; }
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.3f}')"; }
log() { echo "$*" | tee -a "$R/results.txt"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$R/machine.txt"
missing=$(ldd "$B/kiln" "$B/kiln-worker" "$B/bench/kiln_bench_first_call" | grep "not found" || true)
[ -n "$missing" ] && { echo "missing libraries: $missing"; exit 1; }

# One first call in a fresh process: "<wall s> <in-process line...>"
first() {  # cache spec args...
  local cache=$1; shift
  local t0 t1 out
  t0=$(now)
  out=$(KILN_CACHE_DIR=$cache "$B/bench/kiln_bench_first_call" "$@" 2>>"$R/stderr.txt")
  t1=$(now)
  echo "$(secs $t0 $t1) $(echo "$out" | tr '\n' ' ')"
}

if has floor; then
  c=$work/floor
  log "floor cold: $(first $c bench/kernels/empty_cuda.toml --wait-tuned --set n=1024)"
  for i in 1 2 3; do log "floor warm: $(first $c bench/kernels/empty_cuda.toml --set n=1024)"; done
fi

if has kiln; then
  while read -r spec shape; do
    [ -z "$spec" ] && continue
    [[ "$spec $shape" == *${FC_ONLY:-}* ]] || continue  # FC_ONLY=pattern: those rows only
    set -- $shape  # M N K [flags]
    c=$work/kiln-$(basename "$spec" .toml)-$1x$2x$3${4:-}
    log "kiln $spec $shape cold: $(first $c "$spec" ${4:-} --wait-tuned --set M=$1 --set N=$2 --set K=$3)"
    for i in 1 2; do log "kiln $spec $shape warm: $(first $c "$spec" ${4:-} --set M=$1 --set N=$2 --set K=$3)"; done
  done <<'EOF'
kernels/cuda/matmul.toml 1024 1024 1024
kernels/cuda/matmul.toml 777 1333 555
kernels/cuda/matmul.toml 4096 64 4096
kernels/cuda/matmul.toml 1024 1024 1024 --no-library
kernels/cuda/gemm.toml:bf16_nt 1024 1024 1024
kernels/cuda/gemm.toml:bf16_nt 300 14336 4096
kernels/cuda/gemm.toml:bf16_nt 2000 4096 14336
kernels/cuda/gemm_wgmma.toml:bf16_nt 1024 1024 1024 --no-library
EOF
  # The quick choice against an exhaustive tuning of the same shape (the
  # same cache: what the quick search timed is reused, the rest is timed).
  for pair in "kernels/cuda/matmul.toml 777 1333 555" "kernels/cuda/gemm.toml:bf16_nt 300 14336 4096"; do
    [[ "$pair" == *${FC_ONLY:-}* ]] || continue
    set -- $pair
    c=$work/kiln-$(basename "$1" .toml)-$2x$3x$4
    KILN_CACHE_DIR=$c "$B/kiln" -q report --json "$1" --set M=$2 --set N=$3 --set K=$4 > "$R/quick_$(basename $1 .toml)_$2x$3x$4.json" 2>>"$R/stderr.txt"
    t0=$(now)
    KILN_CACHE_DIR=$c "$B/kiln" -q tune --json --effort full "$1" --set M=$2 --set N=$3 --set K=$4 > "$R/full_$(basename $1 .toml)_$2x$3x$4.json" 2>>"$R/stderr.txt"
    log "full tuning $pair: $(secs $t0 $(now)) s"
    python3 - "$R/quick_$(basename $1 .toml)_$2x$3x$4.json" "$R/full_$(basename $1 .toml)_$2x$3x$4.json" <<'PY' | tee -a "$R/results.txt"
import json, sys
q, f = (json.load(open(p)) for p in sys.argv[1:3])
def key(p): return json.dumps(p, sort_keys=True)
times = {key(c["params"]): c["ns"] for c in f["configs"] if c.get("ns")}
qb = times.get(key(q["best"]))
print(f"quick choice {q['best']} timed in the full record: {qb} ns; full best {f['best']} {f['best_ns']:.0f} ns; "
      f"ratio {qb / f['best_ns']:.3f}" if qb else f"quick choice {q['best']} has no time in the full record")
PY
  done
fi

if has inductor; then
  for shape in "fp32 1024 1024 1024" "fp32 777 1333 555" "bf16 300 14336 4096"; do
    set -- $shape
    c=$work/inductor-$1-$2x$3x$4
    for phase in cold warm; do
      t0=$(now)
      out=$(TORCHINDUCTOR_CACHE_DIR=$c python3 bench/gpu/inductor_first_call.py --dtype $1 --m $2 --n $3 --k $4 2>>"$R/stderr.txt")
      log "inductor $shape $phase: $(secs $t0 $(now)) $out"
    done
  done
fi

if has many; then
  bench/first_call/make_kernels.sh cuda 100 "$work/many"
  c=$work/many-cache
  t0=$(now)
  KILN_CACHE_DIR=$c KILN_FIRST_CALL=wait "$B/bench/kiln_bench_many_first_calls" --set n=4096 "$work"/many/k*.toml \
    > "$R/many_tune.txt" 2>>"$R/stderr.txt"
  log "many: tuning 100 kernels in one process: $(secs $t0 $(now)) s ($(cat "$R/many_tune.txt"))"
  cf=$work/floor
  for i in 1 2 3; do
    t0=$(now)
    out=$(KILN_CACHE_DIR=$c "$B/bench/kiln_bench_many_first_calls" --set n=4096 "$work"/many/k*.toml 2>>"$R/stderr.txt")
    log "many warm (100 kernels): $(secs $t0 $(now)) $out"
    log "floor warm: $(first $cf bench/kernels/empty_cuda.toml --set n=4096)"
  done
fi

if has compile; then
  for mode in threads subprocess threads subprocess; do
    c=$work/compile-$mode-$RANDOM
    t0=$(now)
    KILN_CACHE_DIR=$c KILN_COMPILE_MODE=$mode "$B/kiln" -q compile --json kernels/cuda/matmul.toml > "$R/compile_$mode.json" 2>>"$R/stderr.txt"
    n=$(python3 -c "import json; j=json.load(open('$R/compile_$mode.json')); print(sum(1 for c in j['configs'] if c.get('ok')))" 2>/dev/null)
    log "compile matmul space cold, $mode: $(secs $t0 $(now)) s, $n binaries, $(nproc) cores"
  done
fi
echo "== results"; cat "$R/results.txt"
