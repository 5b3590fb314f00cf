# Installs lumos into a fresh prefix, then configures, builds and runs a consumer project that
# finds it with find_package(lumos).
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BINARY_DIR}" --prefix "${prefix}"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer/project" -B "${WORK_DIR}/build"
                -G "${GENERATOR}" -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX}
                -DCMAKE_BUILD_TYPE=Release RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer configure failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer build failed: ${rc}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" "${SOURCE_DIR}/examples/data/tiny_job"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "consumer output:\n${out}")
if(rc)
  message(FATAL_ERROR "consumer run failed: ${rc}")
endif()
if(NOT out MATCHES "rank 1")
  message(FATAL_ERROR "consumer did not read both ranks")
endif()
