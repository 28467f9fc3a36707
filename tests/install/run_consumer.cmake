# Script for the consumer tests (cmake -P): installs tapegrad into a fresh prefix (MODE=install)
# or points at the source tree (MODE=subdirectory), configures, builds and runs tests/consumer.
# MODE=wrong_version asks find_package for a version the package must refuse.
# Arguments (-D): MODE, TAPEGRAD_BINARY_DIR, TAPEGRAD_SOURCE_DIR, WORK_DIR, CXX_COMPILER.
cmake_minimum_required(VERSION 3.20)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "command failed (${result}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
set(consumer_args -S ${TAPEGRAD_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build -DCMAKE_BUILD_TYPE=Release
                  -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(MODE STREQUAL "subdirectory")
  list(APPEND consumer_args -DTAPEGRAD_SOURCE_DIR=${TAPEGRAD_SOURCE_DIR})
else()
  run(${CMAKE_COMMAND} --install ${TAPEGRAD_BINARY_DIR} --prefix ${prefix})
  foreach(file include/tapegrad/tapegrad.hpp include/tapegrad/autodiff/tape.hpp include/tapegrad/autodiff/op.hpp
               include/tapegrad/check/gradcheck.hpp include/tapegrad/io/npy.hpp include/tapegrad/ops/softmax.hpp
               include/tapegrad/ops/fast/softmax_rows.hpp include/tapegrad/models/multihead.hpp
               lib/libtapegrad.a lib/cmake/tapegrad/tapegradConfig.cmake lib/cmake/tapegrad/tapegradConfigVersion.cmake)
    if(NOT EXISTS ${prefix}/${file})
      message(FATAL_ERROR "cmake --install did not install ${file}")
    endif()
  endforeach()
  list(APPEND consumer_args -DCMAKE_PREFIX_PATH=${prefix})
endif()

if(MODE STREQUAL "wrong_version")
  execute_process(COMMAND ${CMAKE_COMMAND} ${consumer_args} -DTAPEGRAD_REQUIRED_VERSION=1.0
                  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(result EQUAL 0 OR NOT err MATCHES "compatible with requested version")
    message(FATAL_ERROR "find_package(tapegrad 1.0) should be refused by the version file:\n${out}\n${err}")
  endif()
  message(STATUS "find_package(tapegrad 1.0) refused, as it should be")
  return()
endif()

run(${CMAKE_COMMAND} ${consumer_args})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
message(STATUS "${last_output}")
if(NOT last_output MATCHES "tapegrad consumer: J = ")
  message(FATAL_ERROR "the consumer printed something unexpected: ${last_output}")
endif()
