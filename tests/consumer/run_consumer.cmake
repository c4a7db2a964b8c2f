# Installs the build tree into a scratch prefix, configures and builds the
# consumer project against it with find_package(kvcache), runs its two
# programs, and checks that the one on kvcache::core alone needs no Redis.
file(REMOVE_RECURSE ${KVCACHE_WORK_DIR})
set(prefix ${KVCACHE_WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${KVCACHE_BUILD_DIR} --prefix ${prefix}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${KVCACHE_CONSUMER_SRC} -B ${KVCACHE_WORK_DIR}/build
  -G Ninja -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure of the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${KVCACHE_WORK_DIR}/build RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "build of the consumer failed: ${rc}")
endif()
foreach(exe consumer_core consumer_serving)
  execute_process(COMMAND ${KVCACHE_WORK_DIR}/build/${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${exe} exited with ${rc}")
  endif()
endforeach()
# The program on the cache layer alone is linked without Redis or xxhash
# (its link line in the consumer's build.ninja; the linker's --as-needed
# would hide an extra library from readelf).
file(READ ${KVCACHE_WORK_DIR}/build/build.ninja ninja)
string(REGEX MATCH "build consumer_core: [^\n]*\n([ ][^\n]*\n)*" core_rule "${ninja}")
if(NOT core_rule MATCHES "LINK_LIBRARIES = [^\n]*kvcache_core")
  message(FATAL_ERROR "no link line of consumer_core found in the consumer's build.ninja")
endif()
if(core_rule MATCHES "hiredis|xxhash")
  message(FATAL_ERROR "consumer_core (kvcache::core only) is linked with:\n${core_rule}")
endif()
