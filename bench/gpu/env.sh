# Sourced by the GPU scripts here, first: moves to the repository root and sets B (the build
# folder: the script's first argument, else build-gpu-carry), OUTD (where results go: $OUT,
# else /tmp/kiln-gpu-out, made) and the carried libraries (B/lib) on LD_LIBRARY_PATH.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
B=${1:-build-gpu-carry}
OUTD=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUTD"
export LD_LIBRARY_PATH=$PWD/$B/lib:${LD_LIBRARY_PATH:-}
