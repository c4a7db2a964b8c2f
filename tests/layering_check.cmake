# The layering rules a build cannot enforce by itself, checked by reading the
# sources (ctest: layering_check, label tools):
#   - no face (model/, engine/, server/, tools/, bench/, fuzz/, python/src/) includes a private
#     header of the library (src/<layer>/...): faces use include/kvcache/ and,
#     where a tool or test needs more, the command's tools/support/ code or
#     the core's uninstalled profiling header (kvcache_profiling);
#   - kvcache_core (its sources src/<core layer>/ and its public headers
#     include/kvcache/*.h) includes nothing of serving: a path rule, serving's
#     public headers are the ones under include/kvcache/serving/.
#   - server/ includes nothing of model/: text goes in and out through the
#     engine (engine/engine.h), which owns the tokenizer.
# Usage: cmake -DROOT=<source dir> -P layering_check.cmake
set(core_layers core format pool cache attention linear eviction hybrid)
set(problems "")

# Appends "file: line (why)" to problems for every #include line of the files
# under ROOT/<dir> for each dir that matches regex.
function(forbid_includes dirs regex why)
  set(files "")
  foreach(dir ${dirs})
    file(GLOB_RECURSE dir_files ${ROOT}/${dir}/*.cc ${ROOT}/${dir}/*.h ${ROOT}/${dir}/*.inc)
    list(APPEND files ${dir_files})
  endforeach()
  forbid_includes_in("${files}" "${regex}" "${why}")
  set(problems "${problems}" PARENT_SCOPE)
endfunction()

# The same for a list of files.
function(forbid_includes_in files regex why)
  foreach(f ${files})
    file(STRINGS ${f} hits REGEX "^#include \"${regex}")
    foreach(h ${hits})
      file(RELATIVE_PATH rel ${ROOT} ${f})
      list(APPEND problems "${rel}: ${h} (${why})")
    endforeach()
  endforeach()
  set(problems "${problems}" PARENT_SCOPE)
endfunction()

list(JOIN core_layers "|" core_re)
forbid_includes("model;engine;server;tools;bench;fuzz;python/src" "(${core_re}|serving)/"
  "a face includes a private header")
forbid_includes("server" "model/" "the server reaches the model through the engine only")
# The one exception: the fuzz target of the Redis tier's reply reader builds
# that private reader's source itself and feeds it through its header.
list(REMOVE_ITEM problems
  "fuzz/redis_reply_fuzz.cc: #include \"serving/tier/resp_reader.h\" (a face includes a private header)")
set(core_dirs ${core_layers})
list(TRANSFORM core_dirs PREPEND "src/")
forbid_includes("${core_dirs}" "(serving/|testing/|kvcache/serving/)"
  "kvcache_core must not use kvcache_serving")
# kvcache_core's public headers: include/kvcache/*.h (serving's are under
# include/kvcache/serving/).
file(GLOB core_headers ${ROOT}/include/kvcache/*.h)
forbid_includes_in("${core_headers}" "kvcache/serving/"
  "a public header of kvcache_core must not use kvcache_serving")

if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "layering:\n  ${text}")
endif()
message(STATUS "layering: faces use public headers only; kvcache_core uses nothing of serving; server/ nothing of model/")
