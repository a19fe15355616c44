#!/usr/bin/env bash
# Fetches the headers of NVIDIA's cuDNN frontend (MIT licence; header-only C++ over
# cuDNN's backend API) into .cache/cudnn-frontend-<version>/include, where CMake looks
# for them: kiln's cudnn library choice (src/backends/cuda/cudnn.cpp) is built with
# them. They come from the frontend's wheel on PyPI (the headers are the same in every
# wheel; the one for CPython 3.11 on x86-64 Linux is taken whatever this machine runs).
# Without them kiln builds and runs, and the choice says it was not built.
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
dest=.cache/cudnn-frontend-$version
[ -f "$dest/include/cudnn_frontend.h" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 "nvidia-cudnn-frontend==$version" -d "$tmp"
wheel=$(ls "$tmp"/*.whl)
echo "$sha256  $wheel" | sha256sum -c --quiet -
python3 - "$wheel" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in z.namelist():
        if n.startswith("include/") or "/licenses/" in n:
            z.extract(n, sys.argv[2])
PY
mkdir -p "$dest"
mv "$tmp/x/include" "$dest/include"
cp "$tmp"/x/*.dist-info/licenses/* "$dest/"
echo "kiln: cuDNN frontend $version headers in $dest" >&2
