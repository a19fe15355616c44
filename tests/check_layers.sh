#!/usr/bin/env bash
# Dependencies point one way: tools → program → dispatch → tune → compile →
# worker → backends → core. Fails naming each #include that points upward.
set -euo pipefail
cd "$(dirname "$0")/.."
rank() {  # the layer of a source file or an included header
  case "$1" in
    src/core/*|core/*) echo 0 ;;
    kiln/error.hpp|kiln/expr.hpp|kiln/hash.hpp|kiln/spec.hpp|kiln/options.hpp|kiln/args.hpp|kiln/version.hpp) echo 0 ;;
    include/kiln/error.hpp|include/kiln/expr.hpp|include/kiln/hash.hpp|include/kiln/spec.hpp) echo 0 ;;
    include/kiln/options.hpp|include/kiln/args.hpp) echo 0 ;;
    kiln/library.hpp|include/kiln/library.hpp|kiln/device.hpp|include/kiln/device.hpp) echo 0 ;;
    kiln/tune_options.hpp|include/kiln/tune_options.hpp) echo 4 ;;
    kiln/ext/library.hpp|include/kiln/ext/library.hpp) echo 1 ;;
    src/backends/*|backends/*|kiln/ext/backend.hpp|include/kiln/ext/backend.hpp|kiln/device_args.hpp|include/kiln/device_args.hpp) echo 1 ;;
    src/worker/*|worker/*) echo 2 ;;
    src/compile/*|compile/*|kiln/ext/binary_key.hpp|include/kiln/ext/binary_key.hpp) echo 3 ;;
    src/tune/*|tune/*|kiln/ext/tuner.hpp|kiln/tuning.hpp|include/kiln/ext/tuner.hpp|include/kiln/tuning.hpp) echo 4 ;;
    kiln/ext/call_view.hpp|include/kiln/ext/call_view.hpp) echo 4 ;;
    kiln/plan.hpp|include/kiln/plan.hpp) echo 4 ;;
    src/dispatch/*|dispatch/*|kiln/kernel.hpp|kiln/multi_kernel.hpp|kiln/runtime.hpp|kiln/artifact.hpp) echo 5 ;;
    include/kiln/kernel.hpp|include/kiln/multi_kernel.hpp|include/kiln/runtime.hpp|include/kiln/artifact.hpp) echo 5 ;;
    kiln/program_spec.hpp|include/kiln/program_spec.hpp) echo 0 ;;
    src/program/*|program/*|kiln/program.hpp|include/kiln/program.hpp) echo 6 ;;
    kiln/memory_plan.hpp|include/kiln/memory_plan.hpp) echo 6 ;;
    kiln/fill.hpp|include/kiln/fill.hpp) echo 6 ;;
    kiln/kiln.hpp|include/kiln/kiln.hpp) echo 6 ;;
    *) echo -1 ;;
  esac
}
bad=0
while IFS= read -r f; do
  from=$(rank "$f")
  [ "$from" -lt 0 ] && { echo "check_layers: no layer for $f (add it to tests/check_layers.sh)"; bad=1; continue; }
  while IFS= read -r inc; do
    to=$(rank "$inc")
    [ "$to" -lt 0 ] && continue  # third-party and system headers
    if [ "$to" -gt "$from" ]; then echo "check_layers: $f includes $inc, a higher layer"; bad=1; fi
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f")
done < <(find src include -name '*.cpp' -o -name '*.hpp' | sort)
# Public headers include public headers only: the installed package has no src/.
while IFS= read -r hit; do
  echo "check_layers: $hit: a public header includes a private one"; bad=1
done < <(grep -rnE '#include "(core|backends|worker|compile|tune|dispatch|program)/' include || true)
# Tiers: the headers an application includes include no extension-tier header (kiln/ext/).
for h in kernel multi_kernel runtime program memory_plan fill plan device_args device tune_options tuning artifact spec library kiln; do
  while IFS= read -r hit; do
    echo "check_layers: include/kiln/$h.hpp:$hit: an application's header includes the extension tier"; bad=1
  done < <(grep -nE '#include "kiln/ext/' "include/kiln/$h.hpp" || true)
done
# Only src/backends/cuda knows NVRTC and the CUDA driver API.
while IFS= read -r hit; do
  echo "check_layers: $hit: NVRTC or the driver API outside src/backends/cuda"; bad=1
done < <(grep -rnE 'cuda_api\.hpp|#include <(cuda|nvrtc|cuda_runtime)[^>]*>|\bnvrtc[A-Z][a-zA-Z]*\(|\bcu(Launch|Module|Library|Ctx|Mem|Stream|Event|Ipc|Graph|Init)[A-Za-z_]*\(' \
           src include tools --include='*.cpp' --include='*.hpp' | grep -v '^src/backends/cuda/' || true)
[ $bad -eq 0 ] && echo "check_layers: every include points down; only src/backends/cuda knows CUDA"
exit $bad
