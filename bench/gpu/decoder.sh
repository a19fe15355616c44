#!/usr/bin/env bash
# The Llama-3-8B decoder layer (kernels/programs/decoder_llama3_8b.toml) beside PyTorch on
# the same GPU (issue 27). kiln: `kiln run --json --check` at each (T, S): the first call
# (compiling and tuning on the real tensors), then whole calls back to back between two
# events (graphs replayed: call_ns), the host time a call, and the result checked against
# kernels/programs/decoder_reference.toml (plain f64 kernels on the cpu: y and both caches
# as the call left them, every element). PyTorch (bench/gpu/torch_decoder.py): eager with
# SDPA and a static cache, torch.compile, torch.compile reduce-overhead, timed the same way
# (calls back to back between two events), each checked against the layer in float64.
# Usage (GPU machine): bench/gpu/decoder.sh [build dir] [which: kiln, torch or both]
#   POINTS="T,S ..." (default below); results: $OUT/decoder.tgz, $OUT/decoder_summary.txt,
#   $OUT/records.tgz (the tuning records; RECORDS_IN=F starts from those of an earlier run)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
WHICH=${2:-both}
R=${RESULTS:-$(mktemp -d /tmp/kiln-decoder-res-XXXXXX)}
mkdir -p "$R"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$(mktemp -d /tmp/kiln-decoder-XXXXXX)}
records_in  # RECORDS_IN=F: records an earlier run wrote (bench/gpu/env.sh)
POINTS=${POINTS:-"1,1024 1,8192 16,1024 128,0 1024,0 4096,0"}
P=kernels/programs/decoder_llama3_8b.toml
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$R/machine.txt"
if [ "$WHICH" != torch ]; then
  for p in $POINTS; do
    t=${p%,*}; s=${p#*,}
    CHECK=--check
    # the f64 reference runs on the cpu: 25 s at T = 2048 on the GPU machine before its loops were
    # reordered (kernels/cpu/reference_f64.cpp); past CHECK_MAX_T it is left out (a point that
    # outruns POINT_TIMEOUT loses its timings too: raise both together)
    [ "$t" -gt "${CHECK_MAX_T:-2048}" ] && CHECK=
    timeout ${POINT_TIMEOUT:-300} "$B/kiln" -q run --json $CHECK "$P" --set T=$t --set S=$s --set CAP=$((s + t)) \
      > "$R/kiln_${t}_${s}.json" 2>> "$R/stderr.txt"
    echo "T=$t S=$s: exit code $? ($(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('call %.1f us, host %.1f us, first %.1f s, check %s' % (j['call_ns']/1e3, j['host_ns_per_call']/1e3, j['first_call_s'], j.get('check', {}).get('ok', '-')))" "$R/kiln_${t}_${s}.json" 2>/dev/null))"
  done
fi
[ "$WHICH" != torch ] && records_out  # $OUTD/records.tgz, for RECORDS_IN on the next machine
if [ "$WHICH" != kiln ]; then
  timeout ${TORCH_TIMEOUT:-400} python3 bench/gpu/torch_decoder.py --points $POINTS --out "$R/torch.json" 2>> "$R/stderr.txt" | tail -12
fi
python3 bench/gpu/decoder_summary.py "$R" | tee "$R/summary.txt" "$OUTD/decoder_summary.txt"
tar czf "$OUTD/decoder.tgz" -C "$R" .
