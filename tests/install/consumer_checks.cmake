# Functions shared by the package tests' scripts (run_consumer.cmake): running commands, and the
# checks on built consumers and Debian packages. Each check returns a verdict (an empty string when
# it holds, else the reason) instead of stopping, so a test can also feed it a deliberately broken
# input (its fault control) and require the rejection.

include(${CMAKE_CURRENT_LIST_DIR}/../command_output.cmake)

# Runs a command; stops the test with its output when it fails. The output is left in last_output.
function(run)
  output_of(out ${ARGN})
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

function(require_holds verdict what)
  if(NOT verdict STREQUAL "")
    message(FATAL_ERROR "${what}: ${verdict}")
  endif()
  message(STATUS "holds: ${what}")
endfunction()

function(require_rejected verdict what)
  if(verdict STREQUAL "")
    message(FATAL_ERROR "fault control not rejected: ${what}")
  endif()
  message(STATUS "fault control rejected, as it should be: ${what} (${verdict})")
endfunction()

# The shared libraries `binary` names (readelf -d, NEEDED entries).
function(needed_libraries variable binary)
  run(readelf -d ${binary})
  string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[([^]\n]+)\\]" lines "${last_output}")
  set(names "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE ".*\\[([^]]+)\\].*" "\\1" name "${line}")
    list(APPEND names ${name})
  endforeach()
  set(${variable} "${names}" PARENT_SCOPE)
endfunction()

# Verdict: `binary` needs libtapegrad.so.<SOVERSION> (linked with the shared library) when `shared`
# is true, and no libtapegrad at all (the static library is inside it) when false.
function(check_links variable binary shared)
  needed_libraries(names ${binary})
  set(soname libtapegrad.so.${SOVERSION})
  list(FILTER names INCLUDE REGEX "^libtapegrad")
  if(shared AND NOT names STREQUAL soname)
    set(${variable} "${binary} needs [${names}], not ${soname}" PARENT_SCOPE)
  elseif(NOT shared AND NOT names STREQUAL "")
    set(${variable} "${binary} should contain the static library but needs [${names}]" PARENT_SCOPE)
  else()
    set(${variable} "" PARENT_SCOPE)
  endif()
endfunction()

# Verdict: with LD_LIBRARY_PATH=libdir, the loader takes libtapegrad.so.<SOVERSION> from libdir (ldd).
function(check_loads_from variable binary libdir)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ldd ${binary}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX MATCH "libtapegrad\\.so\\.${SOVERSION} => [^\n]*" line "${out}")
  string(REGEX MATCH "=> ([^ \n]+)" path "${line}")
  file(REAL_PATH "${libdir}" real_libdir)
  if(CMAKE_MATCH_1 AND EXISTS "${CMAKE_MATCH_1}")
    get_filename_component(found_dir "${CMAKE_MATCH_1}" DIRECTORY)
    file(REAL_PATH "${found_dir}" found_dir)
  endif()
  if(NOT found_dir STREQUAL real_libdir)
    set(${variable} "ldd ${binary} with LD_LIBRARY_PATH=${libdir}: '${line}'" PARENT_SCOPE)
  else()
    set(${variable} "" PARENT_SCOPE)
  endif()
endfunction()

# Runs a consumer program (with LD_LIBRARY_PATH=libdir) and requires its normal output (its gradient
# checks passed, its threads agreed) and exit status 0 (run() stops on any other); then runs it
# with TAPEGRAD_CPU=bogus and requires that it caught the library's tapegrad::value_error itself.
function(run_consumer_program binary libdir)
  run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ${binary})
  message(STATUS "${last_output}")
  if(NOT last_output MATCHES "tapegrad consumer: cpu=[a-z0-9_]+ J = .*tapegrad consumer: checks passed, threads agree")
    message(FATAL_ERROR "${binary} printed something unexpected: ${last_output}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} TAPEGRAD_CPU=bogus ${binary}
                  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 2 OR NOT err MATCHES "caught tapegrad::value_error: TAPEGRAD_CPU=bogus")
    message(FATAL_ERROR "${binary} with TAPEGRAD_CPU=bogus: exit ${result}, expected 2 and the "
                        "library's value_error caught by the program:\n${out}\n${err}")
  endif()
endfunction()

# The consumer built both ways in `build_dir`: consumer holds the static library, consumer_shared
# loads libtapegrad.so.<SOVERSION> from libdir; both run. Fault controls: the shared-library check
# given the static program, and the loader check given a folder without the library.
function(check_consumers build_dir libdir)
  check_links(verdict ${build_dir}/consumer FALSE)
  require_holds("${verdict}" "consumer contains the static library")
  check_links(verdict ${build_dir}/consumer_shared TRUE)
  require_holds("${verdict}" "consumer_shared needs libtapegrad.so.${SOVERSION}")
  check_links(verdict ${build_dir}/consumer TRUE)
  require_rejected("${verdict}" "the static consumer passed off as linking the shared library")
  check_loads_from(verdict ${build_dir}/consumer_shared ${libdir})
  require_holds("${verdict}" "consumer_shared loads libtapegrad from ${libdir}")
  file(MAKE_DIRECTORY ${build_dir}/empty)
  check_loads_from(verdict ${build_dir}/consumer_shared ${build_dir}/empty)
  require_rejected("${verdict}" "consumer_shared loading libtapegrad from a folder without it")
  run_consumer_program(${build_dir}/consumer ${libdir})
  run_consumer_program(${build_dir}/consumer_shared ${libdir})
  # The worked example project (examples/my_op_project), built beside the consumer in the install
  # and subdirectory modes (with_example, run_consumer.cmake): a user's op and its Boost.Test suite
  # through tapegrad_testing.hpp, run by its own CTest.
  if(NOT with_example)
    return()
  endif()
  if(EXISTS ${build_dir}/my_op_project/test_softplus)
    # Its certified suite too where the package has certified gradients (MPFI found).
    set(expected_tests 1)
    if(EXISTS ${build_dir}/my_op_project/test_softplus_certified)
      set(expected_tests 2)
    endif()
    run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} ${CMAKE_CTEST_COMMAND} --test-dir ${build_dir}/my_op_project
        --output-on-failure)
    message(STATUS "${last_output}")
    if(NOT last_output MATCHES "100% tests passed, 0 tests failed out of ${expected_tests}\n")
      message(FATAL_ERROR "examples/my_op_project's test did not pass:\n${last_output}")
    endif()
  else()
    message(FATAL_ERROR "examples/my_op_project was not built in ${build_dir}")
  endif()
endfunction()

# Verdict on a Debian package's control fields: its name, VERSION, and that Depends names every
# entry of the list `depends` (each a regular expression).
function(check_deb_control variable deb package depends)
  run(dpkg-deb --field ${deb} Package Version Depends)
  set(control "${last_output}")
  set(problems "")
  if(NOT control MATCHES "Package: ${package}\n")
    string(APPEND problems "Package is not ${package}; ")
  endif()
  if(NOT control MATCHES "Version: ${VERSION}\n")
    string(APPEND problems "Version is not ${VERSION}; ")
  endif()
  string(REGEX MATCH "Depends: ([^\n]*)" line "${control}")
  set(depends_field "${CMAKE_MATCH_1}")   # (each MATCHES below resets CMAKE_MATCH_1)
  foreach(dependency IN LISTS depends)
    if(NOT depends_field MATCHES "(^|, )${dependency}( |,|$)")
      string(APPEND problems "Depends lacks ${dependency}; ")
    endif()
  endforeach()
  if(problems STREQUAL "")
    set(${variable} "" PARENT_SCOPE)
  else()
    set(${variable} "${deb}: ${problems}fields:\n${control}" PARENT_SCOPE)
  endif()
endfunction()

# A copy of `deb` whose Depends lacks `dependency` (the fault control of check_deb_control).
function(deb_without_dependency good dependency bad)
  get_filename_component(unpacked ${bad} NAME_WE)
  set(unpacked ${WORK_DIR}/${unpacked}.raw)
  run(dpkg-deb --raw-extract ${good} ${unpacked})
  file(READ ${unpacked}/DEBIAN/control control)
  string(REGEX REPLACE "${dependency}[^,\n]*, " "" control "${control}")   # first or middle entry
  string(REGEX REPLACE ", ${dependency}[^,\n]*" "" control "${control}")   # last entry
  file(WRITE ${unpacked}/DEBIAN/control "${control}")
  get_filename_component(bad_dir ${bad} DIRECTORY)
  file(MAKE_DIRECTORY ${bad_dir})
  run(dpkg-deb -Zgzip --root-owner-group --build ${unpacked} ${bad})
endfunction()
