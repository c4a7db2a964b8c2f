# The layering rules a build cannot enforce by itself, checked by reading the
# sources (ctest: layering_check, label tools):
#   - no face (model/, tools/, bench/, fuzz/, python/src/) includes a private
#     header of the library (src/<layer>/...): faces use include/kvcache/ and,
#     where a tool or test needs more, the uninstalled testing/ library;
#   - kvcache_core's sources (src/<core layer>/) include nothing of serving.
# Usage: cmake -DROOT=<source dir> -P layering_check.cmake
set(layers core format pool cache attention linear eviction hybrid serving)
list(JOIN layers "|" layer_re)
set(problems "")
foreach(face model tools bench fuzz python/src)
  file(GLOB_RECURSE files ${ROOT}/${face}/*.cc ${ROOT}/${face}/*.h ${ROOT}/${face}/*.inc)
  foreach(f ${files})
    file(STRINGS ${f} hits REGEX "^#include \"(${layer_re})/")
    foreach(h ${hits})
      file(RELATIVE_PATH rel ${ROOT} ${f})
      list(APPEND problems "${rel}: ${h}")
    endforeach()
  endforeach()
endforeach()
foreach(layer core format pool cache attention linear eviction hybrid)
  file(GLOB_RECURSE files ${ROOT}/src/${layer}/*.cc ${ROOT}/src/${layer}/*.h)
  foreach(f ${files})
    file(STRINGS ${f} hits REGEX "^#include \"(serving/|testing/|kvcache/(offload|tier|prefix_cache|simulator|workload)\\.h)")
    foreach(h ${hits})
      file(RELATIVE_PATH rel ${ROOT} ${f})
      list(APPEND problems "${rel}: ${h} (kvcache_core must not use kvcache_serving)")
    endforeach()
  endforeach()
endforeach()
if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "layering: private headers used across layers:\n  ${text}")
endif()
message(STATUS "layering: faces use public headers only; kvcache_core uses nothing of serving")
