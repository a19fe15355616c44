#!/usr/bin/env bash
# Installs kiln from a build folder into a temporary prefix, packs the
# built-in cpu kernels with the installed tool, builds examples/matmul_app
# against the installed package (find_package, and again through
# pkg-config), and runs it on an empty cache: it must compile and tune
# nothing. Then writes the cpu MLP program's C++ with the installed `kiln
# emit`, builds examples/program_app against the package and runs it (its
# results checked against a plain computation). Removes everything it made,
# also when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
tmp=$(mktemp -d /tmp/kiln-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix with space"
echo "test-install: installing into $prefix"
cmake --install "$BUILD" --prefix "$prefix" >/dev/null
# The installed tree is relocatable: move it, then use it from there.
mv "$prefix" "$tmp/moved"
prefix="$tmp/moved"
export KILN_CACHE_DIR="$tmp/packer-cache"
"$prefix/bin/kiln" -q pack "$prefix/share/kiln/kernels/cpu/matmul.toml" --hints -o "$tmp/app.kiln"
"$prefix/bin/kiln" inspect "$tmp/app.kiln" | head -3
echo "test-install: building examples/matmul_app with find_package(kiln)"
cmake -S examples/matmul_app -B "$tmp/app-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/app-build" >/dev/null
export KILN_CACHE_DIR="$tmp/app-cache"  # empty: everything must come from the artifact
"$tmp/app-build/matmul_app" "$tmp/app.kiln"
echo "test-install: building it again through pkg-config"
export PKG_CONFIG_PATH="$(dirname "$(find "$prefix" -name kiln.pc | head -1)")"
c++ -o "$tmp/matmul_app_pc" examples/matmul_app/main.cpp $(pkg-config --cflags --libs kiln)
rm -rf "$tmp/app-cache"
"$tmp/matmul_app_pc" "$tmp/app.kiln" 64,64,64 1024,1024,1024
echo "test-install: a shape the artifact lacks is tuned, through the installed kiln-worker found beside the library"
out=$("$tmp/app-build/matmul_app" "$tmp/app.kiln" 100,100,100 || true)
echo "$out" | tail -2
echo "$out" | grep -q "100x100x100: ok" && echo "$out" | grep -Eq " [1-9][0-9]* configs timed" \
  || { echo "test-install: the uncovered shape was not tuned as expected"; exit 1; }
echo "test-install: a program: kiln emit writes its C++, examples/program_app builds it against the package"
mkdir -p "$tmp/gen"
"$prefix/bin/kiln" emit "$prefix/share/kiln/kernels/programs/mlp_cpu.toml" -o "$tmp/gen/mlp_cpu_program.hpp"
cmake -S examples/program_app -B "$tmp/prog-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DKILN_EMITTED_DIR="$tmp/gen" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/prog-build" >/dev/null
export KILN_CACHE_DIR="$tmp/prog-cache"
KILN_FIRST_CALL=wait "$tmp/prog-build/program_app" "$prefix/share/kiln/kernels/programs" 1 5 33
echo "test-install: ok"
