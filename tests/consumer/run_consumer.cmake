# Installs the build tree into a scratch prefix, configures and builds the
# consumer project against it with find_package(kvcache), and runs it.
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
execute_process(COMMAND ${KVCACHE_WORK_DIR}/build/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer exited with ${rc}")
endif()
