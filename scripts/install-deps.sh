#!/usr/bin/env bash
# Installs everything lumos needs to build, test and benchmark, from Debian 12 packages only.
set -euo pipefail
packages=(
  build-essential cmake ninja-build clang libclang-rt-14-dev
  libsimdjson-dev zlib1g-dev libisal-dev
  catch2 libbenchmark-dev python3
  libopenmpi-dev openmpi-bin  # optional: `lumos sweep` across processes (LUMOS_WITH_MPI)
)
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
