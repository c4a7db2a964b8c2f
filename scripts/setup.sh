#!/usr/bin/env bash
# Installs the Debian 12 packages kvcache needs, only those that are missing.
# Safe to run repeatedly; needs root (or sudo) only when something is missing.
set -euo pipefail

PACKAGES=(
  cmake ninja-build g++ pkg-config
  libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libxxhash-dev
  clang libclang-rt-14-dev  # fuzz preset: libFuzzer + sanitizer runtimes
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
