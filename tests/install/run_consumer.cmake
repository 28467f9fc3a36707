# Script for the consumer tests (cmake -P), by MODE:
#   install        installs tapegrad's runtime and dev components into a fresh prefix, builds
#                  tests/consumer there with find_package, and runs it linked both ways
#                  (static library; shared library, checked with readelf and ldd);
#   subdirectory   builds tests/consumer with add_subdirectory on the source tree;
#   wrong_version  asks find_package for a version the package must refuse;
#   deb            makes the Debian packages with cpack, checks their fields, unpacks them
#                  (dpkg-deb -x) and builds and runs the consumer with CMAKE_PREFIX_PATH=<dir>/usr;
#   pkgconfig      compiles and links the consumer with plain g++ and pkg-config's flags for the
#                  installed tapegrad.pc, and runs it; a .pc with a wrong -L must fail to link.
# Arguments (-D): MODE, TAPEGRAD_BINARY_DIR, TAPEGRAD_SOURCE_DIR, WORK_DIR, CXX_COMPILER, LIBDIR
# (CMAKE_INSTALL_LIBDIR), VERSION, SOVERSION, PKG_CONFIG (pkgconfig mode), SANITIZE (the build
# tree is the sanitizer build: its libraries are instrumented, so consumers link the sanitizers).
cmake_minimum_required(VERSION 3.20)
include(${CMAKE_CURRENT_LIST_DIR}/consumer_checks.cmake)

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
# The consumers build on every core: in subdirectory mode that includes the library's own sources,
# the longest test of the suite when built one file at a time.
cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
# Release consumers of the Release library of this tree, in every mode: in subdirectory mode the
# library's own sources are compiled again, with the flags the Release tree compiled them with, so
# under a compiler cache (.ci/run sets ccache as the launcher) they are cache hits and the test
# compiles only what is its own (138 s alone at -O0 before, 9 s at Release through a warm cache;
# without a cache it compiles the library at -O3, about three minutes on two cores).
set(consumer_build_type Release)
# No run-time search path in the consumers: the tests say where libtapegrad.so is (LD_LIBRARY_PATH).
set(consumer_args -S ${TAPEGRAD_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build
                  -DCMAKE_BUILD_TYPE=${consumer_build_type} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
                  -DCMAKE_SKIP_BUILD_RPATH=ON)
# The worked example of a user's op (examples/my_op_project) is built and run with the consumer
# against the installed package and against the source tree (its compile would only repeat itself
# in the other modes).
set(with_example OFF)
if(MODE STREQUAL "install" OR MODE STREQUAL "subdirectory")
  set(with_example ON)
endif()
list(APPEND consumer_args -DTAPEGRAD_CONSUMER_WITH_EXAMPLE=${with_example})
set(consumer_link_flags "")
if(SANITIZE STREQUAL "thread")
  set(consumer_link_flags -fsanitize=thread)
  list(APPEND consumer_args -DCMAKE_EXE_LINKER_FLAGS=${consumer_link_flags})
elseif(SANITIZE)
  set(consumer_link_flags -fsanitize=address,undefined)
  list(APPEND consumer_args -DCMAKE_EXE_LINKER_FLAGS=${consumer_link_flags})
endif()

# Installs the two components the packages hold (not the tools) into `prefix` and checks the files.
function(install_library prefix)
  foreach(component runtime dev)
    run(${CMAKE_COMMAND} --install ${TAPEGRAD_BINARY_DIR} --prefix ${prefix} --component ${component})
  endforeach()
  require_files(${prefix})
endfunction()

function(require_files prefix)
  foreach(file include/tapegrad/tapegrad.hpp include/tapegrad/tapegrad_record.hpp include/tapegrad/tapegrad_testing.hpp
               include/tapegrad/autodiff/tape.hpp
               include/tapegrad/autodiff/op.hpp include/tapegrad/autodiff/mp50.hpp include/tapegrad/io/tape_file.hpp
               include/tapegrad/check/gradcheck.hpp include/tapegrad/io/npy.hpp include/tapegrad/ops/softmax.hpp
               include/tapegrad/ops/fast/softmax_rows.hpp include/tapegrad/models/multihead.hpp
               ${LIBDIR}/libtapegrad.a ${LIBDIR}/libtapegrad.so ${LIBDIR}/libtapegrad.so.${SOVERSION}
               ${LIBDIR}/libtapegrad.so.${VERSION} ${LIBDIR}/pkgconfig/tapegrad.pc
               ${LIBDIR}/cmake/tapegrad/tapegradConfig.cmake ${LIBDIR}/cmake/tapegrad/tapegradConfigVersion.cmake)
    if(NOT EXISTS ${prefix}/${file})
      message(FATAL_ERROR "${file} is missing under ${prefix}")
    endif()
  endforeach()
endfunction()

# Configures, builds and checks tests/consumer against the tapegrad found under `prefix`.
function(build_and_check_consumers prefix)
  run(${CMAKE_COMMAND} ${consumer_args} -DCMAKE_PREFIX_PATH=${prefix})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build --parallel ${cores})
  check_consumers(${WORK_DIR}/build ${prefix}/${LIBDIR})
endfunction()

if(MODE STREQUAL "subdirectory")
  run(${CMAKE_COMMAND} ${consumer_args} -DTAPEGRAD_SOURCE_DIR=${TAPEGRAD_SOURCE_DIR})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build --parallel ${cores})
  check_consumers(${WORK_DIR}/build ${WORK_DIR}/build/tapegrad)
elseif(MODE STREQUAL "install")
  install_library(${WORK_DIR}/prefix)
  build_and_check_consumers(${WORK_DIR}/prefix)
elseif(MODE STREQUAL "wrong_version")
  install_library(${WORK_DIR}/prefix)
  execute_process(COMMAND ${CMAKE_COMMAND} ${consumer_args} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
                          -DTAPEGRAD_REQUIRED_VERSION=1.0
                  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(result EQUAL 0 OR NOT err MATCHES "compatible with requested version")
    message(FATAL_ERROR "find_package(tapegrad 1.0) should be refused by the version file:\n${out}\n${err}")
  endif()
  message(STATUS "find_package(tapegrad 1.0) refused, as it should be")
elseif(MODE STREQUAL "deb")
  include(${CMAKE_CURRENT_LIST_DIR}/deb_mode.cmake)
elseif(MODE STREQUAL "pkgconfig")
  include(${CMAKE_CURRENT_LIST_DIR}/pkgconfig_mode.cmake)
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
