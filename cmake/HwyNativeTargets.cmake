# kvcache_hwy_native_disabled_targets(<out-var> <default> <with-avx3-dl>)
#
# For builds that should compile only the build machine's own best Highway
# target plus the scalar fallback (the sanitizer presets: the code that runs
# on this machine is the code that gets sanitized, and one target instead of
# three keeps the instrumented build short). Runs a probe linked against the
# installed Highway that prints hwy::SupportedTargets(), picks the best of the
# targets the release build compiles (AVX3, AVX2, SSE4; AVX3_DL too when
# <with-avx3-dl> is true, i.e. KVCACHE_HWY_AVX3_DL; SSSE3 never) that this CPU
# supports, and sets <out-var> to the
# HWY_DISABLED_TARGETS expression that removes the others. Falls back to
# <default> (with a message) when the probe cannot run (cross builds, non-x86).
function(kvcache_hwy_native_disabled_targets out_var default with_avx3_dl)
  set(probe_dir ${CMAKE_BINARY_DIR}/hwy_native_probe)
  file(WRITE ${probe_dir}/probe.cc [=[
#include <hwy/targets.h>
#include <cstdio>
int main() {
  std::printf("%lld", static_cast<long long>(hwy::SupportedTargets()));
  return 0;
}
]=])
  try_run(run_result compile_result ${probe_dir}/build ${probe_dir}/probe.cc
          LINK_LIBRARIES hwy::hwy
          COMPILE_OUTPUT_VARIABLE compile_out
          RUN_OUTPUT_VARIABLE mask)
  if(NOT compile_result OR NOT run_result EQUAL 0 OR NOT mask MATCHES "^[0-9]+$")
    message(STATUS "kvcache: Highway target probe failed; disabled targets stay ${default}")
    set(${out_var} "${default}" PARENT_SCOPE)
    return()
  endif()
  # Bits from hwy/detect_targets.h (Highway 1.0.3): lower is better.
  set(names AVX3 AVX2 SSE4)
  set(bits 8 9 11)
  set(disabled "HWY_SSSE3")
  if(with_avx3_dl)
    list(PREPEND names AVX3_DL)
    list(PREPEND bits 7)
  else()
    string(APPEND disabled "|HWY_AVX3_DL")
  endif()
  list(LENGTH names n)
  math(EXPR last "${n} - 1")
  set(best "")
  foreach(i RANGE ${last})
    list(GET names ${i} name)
    list(GET bits ${i} bit)
    math(EXPR has "(${mask} >> ${bit}) & 1")
    if(has AND best STREQUAL "")
      set(best ${name})
    endif()
  endforeach()
  foreach(name IN LISTS names)
    if(NOT name STREQUAL best)
      string(APPEND disabled "|HWY_${name}")
    endif()
  endforeach()
  if(best STREQUAL "")
    message(STATUS "kvcache: this CPU runs none of AVX3/AVX2/SSE4: scalar only")
  else()
    message(STATUS "kvcache: compiling only this machine's best Highway target ${best} (plus scalar)")
  endif()
  set(${out_var} "${disabled}" PARENT_SCOPE)
endfunction()
