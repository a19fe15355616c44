#!/usr/bin/env bash
# Every config of rmsnorm_bf16 and rope_cache_bf16 tuned (`kiln tune --effort full`, --inputs
# wide too) against the reference config each spec names, at shapes of the Llama-3-8B layer and
# at odd ones: a config that disagrees with the reference is recorded "wrong". Prints each
# tuning's line of configs ok and failed by kind.
# Usage (GPU machine): bench/gpu/norm_rope_refs_check.sh [build dir]   (results: $OUT/refs_check.txt)
set -uo pipefail
source "$(dirname "$0")/env.sh"  # the repository root; B, OUTD, the carried libraries
export KILN_CACHE_DIR=$(mktemp -d /tmp/kiln-refs-XXXXXX)
trap 'rm -rf "$KILN_CACHE_DIR"' EXIT
one() {  # spec inputs sets...
  local spec=$1 inputs=$2; shift 2
  local sets=() s
  for s in "$@"; do sets+=(--set "$s"); done
  timeout 120 "$B/kiln" -q tune --json --effort full --force --inputs "$inputs" "$spec" "${sets[@]}" 2>/dev/null | python3 -c '
import json, sys, collections
d = json.load(sys.stdin)
kinds = collections.Counter(c.get("result", "?") for c in d["configs"])
wrong = [c["params"] for c in d["configs"] if c.get("result") == "wrong"]
print(sys.argv[1], dict(kinds), "reference", d.get("reference"), "best", d.get("best"), *(["wrong:", wrong] if wrong else []))' "$spec ($inputs) $*"
}
{
  for inputs in uniform wide; do
    for t in 1 1024 77; do one kernels/cuda/rmsnorm_bf16.toml $inputs T=$t H=4096 eps=1e-5; done
    one kernels/cuda/rmsnorm_bf16.toml $inputs T=5 H=4104 eps=1e-5
    for ts in 1,1024 1024,0 77,300; do
      t=${ts%,*}; s=${ts#*,}
      one kernels/cuda/rope_cache_bf16.toml $inputs T=$t S=$s CAP=$((s + t + 3)) HQ=32 HKV=8 theta=500000
    done
    one kernels/cuda/rope_cache_bf16.toml $inputs T=3 S=100000 CAP=100010 HQ=12 HKV=3 theta=500000
  done
} | tee "$OUTD/refs_check.txt"
