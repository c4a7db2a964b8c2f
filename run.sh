#!/usr/bin/env bash
# kvcache's one entry point.
#   ./run.sh demo              install what is missing, build, run the main job
#   ./run.sh test              install, build, run every test (what CI runs)
#   ./run.sh kvcache ARGS...   run the CLI from the release build
#   ./run.sh bench [ARGS...]   run the Google Benchmark suite (short by default)
#   ./run.sh report [--full]   measure here, draw the charts under docs/img/
#   ./run.sh sanitize [asan|tsan]  build with a sanitizer and run the tests
#                              (asan: address+undefined, whole suite; tsan:
#                              the layers with concurrent tests; both: a
#                              short `kvcache soak`, label soak)
#   ./run.sh fuzz [SECONDS [TARGET...]]  build the libFuzzer targets (clang,
#                              ASan+UBSan), run each SECONDS (default 30) on its corpus
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
JOBS="${KVCACHE_JOBS:-$(nproc)}"

# The project's Python environment (scripts/setup.sh makes it): first on PATH,
# so CMake builds the extension for it and the tests run in it.
export KVCACHE_VENV="${KVCACHE_VENV:-$ROOT/build/venv}"
setup() {
  "$ROOT/scripts/setup.sh"
  export VIRTUAL_ENV="$KVCACHE_VENV" PATH="$KVCACHE_VENV/bin:$PATH"
}
# --- issue 16: SmolLM2's GGUF, fetched once into ${KVCACHE_MODEL_DIR:-~/.cache/kvcache/models} ---
fetch_model() {
  "$ROOT/scripts/fetch_model.sh" >/dev/null ||
    echo "run.sh: SmolLM2 could not be fetched; the model_smollm tests and the demo will fail" >&2
}

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
    fetch_model
    build release kvcache_cli >/dev/null
    exec "build/release/tools/kvcache" demo "$@"
    ;;
  test)
    setup
    fetch_model
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
    case "$preset" in
      asan)  # address + undefined behaviour: the whole suite
        build asan
        # (model_smollm: the SmolLM2 tests, minutes under a sanitizer; issue 16)
        ctest --test-dir build/asan -j "$JOBS" --output-on-failure -LE '^(slow|model_smollm)$' "$@"
        ;;
      tsan)  # threads: the layers whose tests run concurrent work
        build tsan kvcache_core_tests kvcache_pool_tests kvcache_cache_tests \
          kvcache_serving_tests kvcache_attention_tests kvcache_cli
        # Without address-space randomization: GCC 12's TSan runtime cannot
        # map its shadow memory under the large mmap randomization of newer
        # kernels (vm.mmap_rnd_bits > 28).
        setarch "$(uname -m)" -R ctest --test-dir build/tsan -j "$JOBS" --output-on-failure \
          -L '^(core|pool|cache|serving|attention|soak)$' "$@"
        ;;
      *)
        echo "run.sh sanitize: asan or tsan" >&2
        exit 2
        ;;
    esac
    ;;
  report)  # measure here and draw docs/img/*.png (scripts/report.sh; --full for 32k context)
    setup
    build release kvcache_cli kvcache_python_package >/dev/null
    exec "$ROOT/scripts/report.sh" "$@"
    ;;
  # --- fuzz (issue 19): the targets named (default: every one in
  # fuzz/CMakeLists.txt), SECONDS each, on top of fuzz/corpus/<target>/
  # (read only: new inputs go to build/fuzz/work/, crashes to
  # build/fuzz/artifacts/). Builds only what those targets need. Fails on
  # a crash, a leak or a broken check.
  fuzz)
    setup
    secs="${1:-30}"; shift || true
    if [ $# -gt 0 ]; then
      build fuzz "${@/#/fuzz_}"
      bins=("${@/#/build/fuzz/fuzz/fuzz_}")
    else
      build fuzz kvcache_fuzz_targets
      bins=(build/fuzz/fuzz/fuzz_*)
    fi
    status=0
    for bin in "${bins[@]}"; do
      t="${bin##*/fuzz_}"
      mkdir -p "build/fuzz/work/$t" "build/fuzz/artifacts/$t"
      log="build/fuzz/work/$t.log"
      if "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
          -artifact_prefix="build/fuzz/artifacts/$t/" "build/fuzz/work/$t" "fuzz/corpus/$t" \
          >"$log" 2>&1; then
        echo "fuzz $t: ok: $(grep -E '^#[0-9]+' "$log" | tail -1 | sed 's/  */ /g')"
      else
        echo "fuzz $t: FAILED (log $log; inputs in build/fuzz/artifacts/$t/)"
        tail -30 "$log"
        status=1
      fi
    done
    exit "$status"
    ;;
  build)
    setup
    build "${1:-release}"
    ;;
  *)
    sed -n '2,13p' "$0"
    ;;
esac
