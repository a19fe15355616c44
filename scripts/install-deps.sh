#!/usr/bin/env bash
# Installs the Debian packages kiln builds and tests with, when they are missing.
# Run as root (it does nothing, and says so, when everything is present).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      libfmt-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libxxhash-dev
      libgtest-dev libgmock-dev libbenchmark-dev
      libhiredis-dev redis-server libopenblas0 libxgboost-dev
      libplplot-dev plplot-driver-cairo
      python3-torch)
if [ "${1:-}" = "--fuzz" ]; then pkgs+=(clang libclang-rt-14-dev); fi
# cuDNN's frontend headers, for the cudnn library choice (optional: without them the
# choice says it was not built).
"$(dirname "$0")/fetch-cudnn-frontend.sh" ||
  echo "kiln: the cuDNN frontend's headers could not be fetched; kiln builds without the cudnn library choice" >&2
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "kiln: missing packages: ${missing[*]}" >&2
  echo "kiln: run as root, or install them: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "kiln: installing ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
