#!/usr/bin/env bash
# What each part of the decoder layer adds to a whole call where the launches overlap: the
# layer (kernels/programs/decoder_llama3_8b.toml) beside variants with steps taken out
# (bench/gpu/layer_ablation.py: attention; RoPE and attention; the first RMSNorm too; both
# RMSNorms; all but the MLP's two GEMMs), each kernel keeping its shape. One cache: the
# first run tunes, the variants reuse its records; then two rounds of whole calls back to
# back (`kiln run --json`), the variants in turn, reversed in the second round. Timing only:
# the variants compute nothing meaningful, and the full layer is checked (--check) once.
# Usage (GPU machine): bench/gpu/layer_ablation.sh [build dir]   (results: $OUT/ablation/)
#   POINTS "T,S ..." (default "1,1024")
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
R=$OUTD/ablation
mkdir -p "$R"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-ablation-cache}
POINTS=${POINTS:-"1,1024"}
V=$(python3 bench/gpu/layer_ablation.py kernels/programs)
trap 'rm -f kernels/programs/ablate_*.toml' EXIT  # (also where a time limit ends the run)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/machine.txt"
run() {  # run PROGRAM T S TAG [extra args]
  local prog=$1 t=$2 s=$3 tag=$4; shift 4
  timeout 400 "$B/kiln" -q run --json "$@" "$prog" --set T=$t --set S=$s --set CAP=$((s + t + 1)) \
    > "$R/$tag.json" 2>> "$R/stderr.txt"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('%-40s call %8.1f us, check %s' % (sys.argv[2], j['call_ns']/1e3, j.get('check', {}).get('ok', '-')))
if sys.argv[2].endswith('_tune'):
    for s in j['steps']: print('      %8.1f us  %s' % (s['ns']/1e3, s['choice']))" \
    "$R/$tag.json" "$tag" 2>/dev/null | tee -a "$R/summary.txt" || echo "$tag: failed" | tee -a "$R/summary.txt"
}
for p in $POINTS; do
  t=${p%,*}; s=${p#*,}
  run kernels/programs/decoder_llama3_8b.toml $t $s "layer_T${t}_S${s}_tune" --check
  for round in 1 2; do
    list=$V; [ $round = 2 ] && list=$(echo $V | tr ' ' '\n' | tac)
    for v in $list; do run "kernels/programs/ablate_$v.toml" $t $s "${v}_T${t}_S${s}_$round"; done
  done
done
