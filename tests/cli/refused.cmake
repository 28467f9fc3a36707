# One row of the refused-options table (tests/cli/CMakeLists.txt), run by CTest as `cmake -P`:
# runs PROGRAM with ARGUMENTS (a list; @WORK@ in one stands for an empty scratch folder, where
# output options point) and requires that it refuses them as a bad command line: exit status
# EXIT, MESSAGE (a regular expression) on stderr, nothing on stdout, and nothing created in the
# scratch folder.
cmake_minimum_required(VERSION 3.20)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
string(REPLACE "@WORK@" "${WORK}" arguments "${ARGUMENTS}")
execute_process(COMMAND ${PROGRAM} ${arguments} WORKING_DIRECTORY ${WORK}
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
set(problems "")
if(NOT result STREQUAL "${EXIT}")
  string(APPEND problems "exit status ${result}, expected ${EXIT}; ")
endif()
if(NOT err MATCHES "${MESSAGE}")
  string(APPEND problems "stderr does not match '${MESSAGE}'; ")
endif()
if(NOT out STREQUAL "")
  string(APPEND problems "something was printed on stdout; ")
endif()
file(GLOB_RECURSE created LIST_DIRECTORIES true ${WORK}/*)
if(created)
  string(APPEND problems "files were created: ${created}; ")
endif()
if(NOT problems STREQUAL "")
  message(FATAL_ERROR "${PROGRAM} ${arguments}: ${problems}\nstdout:\n${out}\nstderr:\n${err}")
endif()
message(STATUS "refused as it should be: ${PROGRAM} ${arguments}\n  ${err}")
