#!/usr/bin/env bash
# Installs everything lumos needs to build, test and benchmark, from Debian 12 packages only:
# the C++ toolchain and libraries, and what the test suite runs beside them (the Python package's
# pybind11, NumPy and pytest; headless Chromium and Selenium for the HTML report; PyTorch's CPU
# build for the capture tests), so that the README's test command skips no suite.
set -euo pipefail
packages=(
  build-essential cmake ninja-build clang libclang-rt-14-dev
  libsimdjson-dev zlib1g-dev libisal-dev
  catch2 libbenchmark-dev python3
  libopenmpi-dev openmpi-bin  # optional: `lumos sweep` across processes (LUMOS_WITH_MPI)
  python3-dev python3-venv python3-pip python3-wheel pybind11-dev python3-pybind11 python3-numpy python3-pytest
  python3-selenium chromium chromium-driver  # the HTML report in a real browser
  python3-torch  # the capture tests (examples/capture/) on the CPU
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
