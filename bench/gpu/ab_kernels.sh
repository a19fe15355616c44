#!/usr/bin/env bash
# A kernel change measured against the kernels it replaces, in one run on one GPU: OLD is a
# folder holding an earlier kernels/ tree (make it with
#   mkdir -p ab-old && git archive <commit> kernels | tar -x -C ab-old),
# NEW the repository's own. Each program runs from each tree (`kiln run --json`) on one
# cache, so what both trees share is tuned once; then each runs again in the order
# new, old, new (warm: nothing tuned) and whole calls back to back are compared. The layer
# from the new tree is checked against its reference (--check).
# Usage (GPU machine): OLD=ab-old bench/gpu/ab_kernels.sh [build dir]   (results: $OUT/ab.tgz, $OUT/ab_summary.txt)
#   POINTS "T,S ..." for the layer (default "1,1024 1,8192"); MODEL=1 adds the model at T = 1, S = 1024
#   TREES "OLD . X .." compares more than two trees (default "$OLD ."): each is tuned once, then
#   two rounds run them all in turn; only the repository's own tree (.) is checked
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
R=$OUTD/ab
mkdir -p "$R"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-ab-cache}
TREES=${TREES:-"${OLD:?OLD: a folder holding the earlier kernels/ tree} ."}
POINTS=${POINTS:-"1,1024 1,8192"}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/machine.txt"
run() {  # run TREE PROGRAM T S TAG [extra args]
  local tree=$1 prog=$2 t=$3 s=$4 tag=$5; shift 5
  timeout 500 "$B/kiln" -q run --json "$@" "$tree/kernels/programs/$prog.toml" --set T=$t --set S=$s --set CAP=$((s + t + 1)) \
    > "$R/$tag.json" 2>> "$R/stderr.txt"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('%-28s call %8.1f us, first %5.1f s, check %s' % (sys.argv[2], j['call_ns']/1e3, j['first_call_s'], j.get('check', {}).get('ok', '-')))
if sys.argv[2].startswith('layer_') and sys.argv[2].endswith('_tune'):  # the layer's choices (the model's are the same kernels)
    for s in j['steps']: print('      %8.1f us  %s' % (s['ns']/1e3, s['choice']))" \
    "$R/$tag.json" "$tag" 2>/dev/null | tee -a "$R/summary.txt" || echo "$tag: failed (exit code $?)" | tee -a "$R/summary.txt"
}
tag() { if [ "$1" = . ]; then echo new; elif [ "$1" = "${OLD:-}" ]; then echo old; else basename "$1"; fi; }
order() {  # the trees in turn, reversed in even rounds (each tree runs once first and once last)
  if [ $(($1 % 2)) = 1 ]; then echo $TREES; else echo $TREES | tr ' ' '\n' | tac | tr '\n' ' '; fi
}
for p in $POINTS; do
  t=${p%,*}; s=${p#*,}
  for tree in $TREES; do
    if [ "$tree" = . ]; then run . decoder_llama3_8b $t $s "layer_T${t}_S${s}_$(tag "$tree")_tune" --check
    else run "$tree" decoder_llama3_8b $t $s "layer_T${t}_S${s}_$(tag "$tree")_tune"; fi
  done
  for round in 1 2; do
    for tree in $(order "$round"); do run "$tree" decoder_llama3_8b $t $s "layer_T${t}_S${s}_$(tag "$tree")_$round"; done
  done
done
if [ "${MODEL:-0}" = 1 ]; then
  for tree in $TREES; do run "$tree" model_llama3_8b 1 1024 "model_S1024_$(tag "$tree")_tune"; done
  for round in 1 2; do
    for tree in $(order "$round"); do run "$tree" model_llama3_8b 1 1024 "model_S1024_$(tag "$tree")_$round"; done
  done
fi
# every run's output travels as one archive; the summary beside it
tar czf "$OUTD/ab.tgz" -C "$R" . && cp "$R/summary.txt" "$OUTD/ab_summary.txt" && rm -rf "$R"
