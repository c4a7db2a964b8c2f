#!/usr/bin/env bash
# kvcache's one entry point.
#   ./run.sh demo              install what is missing, build, run the main job
#   ./run.sh test              install, build, run every test (what CI runs)
#   ./run.sh kvcache ARGS...   run the CLI from the release build
#   ./run.sh bench [ARGS...]   run the Google Benchmark suite (short by default)
#   ./run.sh sanitize [asan|tsan]  build with a sanitizer and run the tests
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
JOBS="${KVCACHE_JOBS:-$(nproc)}"

setup() { "$ROOT/scripts/setup.sh"; }

# build PRESET [TARGET...]
build() {
  local preset="$1"; shift
  if [ ! -f "build/$preset/build.ninja" ]; then
    cmake --preset "$preset" >/dev/null
  fi
  cmake --build "build/$preset" -j "$JOBS" ${1:+--target "$@"}
}

cmd="${1:-help}"; shift || true
case "$cmd" in
  demo)
    setup
    build release kvcache_cli >/dev/null
    exec "build/release/tools/kvcache" demo "$@"
    ;;
  test)
    setup
    build release
    ctest --test-dir build/release -j "$JOBS" --output-on-failure "$@"
    ;;
  kvcache)
    setup
    build release kvcache_cli >/dev/null
    exec "build/release/tools/kvcache" "$@"
    ;;
  bench)
    setup
    build release kvcache_bench >/dev/null
    exec "build/release/bench/kvcache_bench" --benchmark_min_time=0.05 "$@"
    ;;
  sanitize)
    setup
    preset="${1:-asan}"; shift || true
    build "$preset"
    ctest --test-dir "build/$preset" -j "$JOBS" --output-on-failure -LE slow "$@"
    ;;
  build)
    setup
    build "${1:-release}"
    ;;
  *)
    sed -n '2,8p' "$0"
    ;;
esac
