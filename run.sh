#!/usr/bin/env bash
# kvcache's one entry point.
#   ./run.sh demo              install what is missing, build, run the main job
#   ./run.sh test              install, build, run every test (what CI runs)
#   ./run.sh kvcache ARGS...   run the CLI from the release build
#   ./run.sh serve [ARGS...]   kvcache serve on SmolLM2 (OpenAI-compatible,
#                              127.0.0.1:8080 unless --host/--port say otherwise)
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
# One line per step on stderr, so a first run that takes minutes says what
# it is doing.
step() { echo "run.sh: $*" >&2; }

setup() {
  [ "${1:-}" = quiet ] || step "checking the Debian packages and the Python environment (installs what is missing)"
  "$ROOT/scripts/setup.sh"
  export VIRTUAL_ENV="$KVCACHE_VENV" PATH="$KVCACHE_VENV/bin:$PATH"
}
# SmolLM2's GGUF, fetched once into ${KVCACHE_MODEL_DIR:-~/.cache/kvcache/models}.
fetch_model() {
  step "fetching SmolLM2-135M (once, about 93 MB, into ${KVCACHE_MODEL_DIR:-~/.cache/kvcache/models})"
  "$ROOT/scripts/fetch_model.sh" >/dev/null ||
    echo "run.sh: SmolLM2 could not be fetched; the model_smollm tests and the demo will fail" >&2
}
# Gemma 3 270M's GGUF (the tests' sliding-window model), fetched once beside it.
fetch_gemma() {
  step "fetching Gemma 3 270M (once, about 238 MB, into ${KVCACHE_MODEL_DIR:-~/.cache/kvcache/models})"
  "$ROOT/scripts/fetch_model.sh" gemma3 >/dev/null ||
    echo "run.sh: Gemma 3 could not be fetched; the model_gemma tests will fail" >&2
}

# Reads ninja's "[done/total] ..." lines: prints the header $1 at the first
# step that compiles or links (a build with nothing to do stays quiet: the
# re-check of the source globs and a CMake re-run do not count), then one
# line at every tenth, then how long it took.
progress() {
  local header="$1" start=$SECONDS shown=0 total=0 started=0 line done_ n what pct
  while IFS= read -r line; do
    [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\ (.*)$ ]] || continue
    done_=${BASH_REMATCH[1]} n=${BASH_REMATCH[2]} what=${BASH_REMATCH[3]}
    case "$what" in "Re-checking globbed"*|"Re-running CMake"*) continue ;; esac
    if [ "$started" = 0 ]; then started=1; step "$header"; fi
    # (a CMake re-run first shows a total of its own)
    [ "$n" = "$total" ] || { total=$n; shown=0; }
    pct=$((100 * done_ / n / 10 * 10))
    if [ "$pct" -gt "$shown" ]; then
      shown=$pct
      echo "run.sh:   $pct% ($done_ of $n steps)" >&2
    fi
  done
  if [ "$started" = 1 ]; then step "the build ran for $((SECONDS - start)) s"; fi
}

# build PRESET [TARGET...]: the build's output goes to build/PRESET/build.log;
# the screen gets progress lines (above), and the log's end if it fails.
build() {
  local preset="$1"; shift
  local dir="build/$preset" log="build/$preset/build.log"
  if [ ! -f "$dir/build.ninja" ]; then
    step "configuring $dir"
    mkdir -p "$dir"
    cmake --preset "$preset" >"$dir/configure.log" 2>&1 || { tail -30 "$dir/configure.log" >&2; return 1; }
  fi
  if ! cmake --build "$dir" -j "$JOBS" ${1:+--target "$@"} 2>&1 | tee "$log" |
      progress "building $dir${1:+ ($*)} with $JOBS jobs (a first build of everything takes 6 to 25 minutes on 2 cores, by CPU; log: $log)"; then
    echo "run.sh: the build failed; the end of $log:" >&2
    tail -40 "$log" >&2
    return 1
  fi
}

cmd="${1:-help}"; shift || true
case "$cmd" in
  demo)
    setup
    fetch_model
    build release kvcache_cli
    step "running kvcache demo (a minute or two)"
    exec "build/release/tools/kvcache" demo "$@"
    ;;
  test)
    setup
    fetch_model
    fetch_gemma
    build release
    step "running the tests (ctest, $JOBS at a time; 3 to 10 minutes)"
    ctest --test-dir build/release -j "$JOBS" --output-on-failure "$@"
    ;;
  kvcache)
    setup quiet
    build release kvcache_cli
    exec "build/release/tools/kvcache" "$@"
    ;;
  serve)
    setup quiet
    fetch_model
    build release kvcache_cli
    exec "build/release/tools/kvcache" serve \
      --model "${KVCACHE_MODEL_DIR:-$HOME/.cache/kvcache/models}/SmolLM2-135M-Instruct.Q4_1.gguf" "$@"
    ;;
  bench)
    setup
    build release kvcache_bench
    exec "build/release/bench/kvcache_bench" --benchmark_min_time=0.05 "$@"
    ;;
  sanitize)
    setup
    preset="${1:-asan}"; shift || true
    case "$preset" in
      asan)  # address + undefined behaviour: the whole suite
        build asan
        # (model_smollm, model_gemma: the real models' tests, minutes under a sanitizer)
        ctest --test-dir build/asan -j "$JOBS" --output-on-failure -LE '^(slow|model_smollm|model_gemma)$' "$@"
        ;;
      tsan)  # threads: the layers whose tests run concurrent work
        build tsan kvcache_core_tests kvcache_pool_tests kvcache_cache_tests \
          kvcache_serving_tests kvcache_attention_tests kvcache_engine_tests kvcache_cli
        # Without address-space randomization: GCC 12's TSan runtime cannot
        # map its shadow memory under the large mmap randomization of newer
        # kernels (vm.mmap_rnd_bits > 28).
        setarch "$(uname -m)" -R ctest --test-dir build/tsan -j "$JOBS" --output-on-failure \
          -L '^(core|pool|cache|serving|attention|engine|soak)$' "$@"
        ;;
      *)
        echo "run.sh sanitize: asan or tsan" >&2
        exit 2
        ;;
    esac
    ;;
  report)  # measure here and draw docs/img/*.png (scripts/report.sh; --full for 32k context)
    setup
    build release kvcache_cli kvcache_python_package
    exec "$ROOT/scripts/report.sh" "$@"
    ;;
  # --- fuzz: the targets named (default: every one in
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
      # every built target (the folder also holds generated files)
      bins=()
      for f in build/fuzz/fuzz/fuzz_*; do
        [[ -f "$f" && -x "$f" ]] && bins+=("$f")
      done
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
    sed -n '2,15p' "$0"
    ;;
esac
