# Sourced by the GPU scripts here, first: moves to the repository root and sets B (the build
# folder: the script's first argument, else build-gpu-carry), OUTD (where results go: $OUT,
# else /tmp/kiln-gpu-out, made) and the carried libraries (B/lib) on LD_LIBRARY_PATH.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
B=${1:-build-gpu-carry}
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
# cuDNN (the cudnn library choice), where the machine has it only beside PyTorch, in a wheel's
# folder the loader does not search (KILN_NO_CUDNN=1 leaves it out).
if [ -z "${KILN_NO_CUDNN:-}" ]; then
  cudnn_dir=$(python3 - 2>/dev/null <<'PY'
import os, site
for p in site.getsitepackages() + [site.getusersitepackages()]:
    for sub in ("nvidia/cudnn/lib", "nvidia/cu13/lib"):
        d = os.path.join(p, sub)
        if os.path.exists(os.path.join(d, "libcudnn.so.9")):
            print(d)
            raise SystemExit
PY
  )
  if [ -n "$cudnn_dir" ]; then export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$cudnn_dir; fi
fi
# Tuning records kept from one GPU machine to the next (a fresh machine tunes everything
# again): a script calls records_in once KILN_CACHE_DIR is set, and records_out at its end.
# With RECORDS_IN=F (a records.tgz an earlier run wrote), records_in unpacks F's records into
# $KILN_CACHE_DIR/tune, so what was tuned there is answered from the cache here (the chosen
# configs are still compiled); records_out writes the cache's records to $OUTD/records.tgz.
records_in() {
  [ -n "${RECORDS_IN:-}" ] || return 0
  if [ ! -f "$RECORDS_IN" ]; then echo "RECORDS_IN=$RECORDS_IN: no such file; tuning from nothing" >&2; return 0; fi
  # (a cache folder others can write is refused: made 0700, as kiln makes it; the files this
  # user's, whoever wrote the archive)
  (umask 077 && mkdir -p "$KILN_CACHE_DIR/tune") && tar xzf "$RECORDS_IN" --no-same-owner -C "$KILN_CACHE_DIR/tune" &&
    echo "records from $RECORDS_IN: $(find "$KILN_CACHE_DIR/tune" -type f | wc -l) files"
}
records_out() {
  if [ -d "$KILN_CACHE_DIR/tune" ]; then tar czf "$OUTD/records.tgz" -C "$KILN_CACHE_DIR/tune" .; fi
}
# Nsight Compute's command-line profiler, wherever the machine has it ("" where it has none).
find_ncu() { command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1; }
