# Holds tests/at_cpu_level.cmake to its promise (cmake -P): at every level but the default run's it
# runs the test at that level (here the test is cpu_level_default itself, which prints the level it
# ran at), at the default level it skips, so exactly one level is skipped, and a failing test fails
# the rerun. Arguments (-D): PROBE (cpu_level_default), LEVELS (the levels built into the library),
# WRAPPER (at_cpu_level.cmake).
cmake_minimum_required(VERSION 3.20)
execute_process(COMMAND ${PROBE} OUTPUT_VARIABLE default_level OUTPUT_STRIP_TRAILING_WHITESPACE
                COMMAND_ERROR_IS_FATAL ANY)
function(rerun level executable)
  execute_process(COMMAND ${CMAKE_COMMAND} -DEXECUTABLE=${executable} -DLEVEL=${level} -DPROBE=${PROBE}
                          -P ${WRAPPER}
                  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(result ${result} PARENT_SCOPE)
  set(out "${out}${err}" PARENT_SCOPE)
endfunction()
set(skipped "")
set(ran "")
foreach(level IN LISTS LEVELS)
  rerun(${level} ${PROBE})
  if(out MATCHES "TAPEGRAD_CPU=${level}: this CPU does not support it")
    continue()  # the rerun prints CTest's skip message for a level this CPU lacks
  endif()
  if(level STREQUAL default_level)
    if(NOT result EQUAL 0 OR NOT out STREQUAL "TAPEGRAD_CPU=${level}: the default run's level here; that run covers it\n")
      message(FATAL_ERROR "at the default level ${level} the rerun should skip, it gave (${result}):\n${out}")
    endif()
    list(APPEND skipped ${level})
  else()
    if(NOT result EQUAL 0 OR NOT out STREQUAL "${level}\n")
      message(FATAL_ERROR "at ${level} (default ${default_level}) the rerun should run there, it gave (${result}):\n${out}")
    endif()
    list(APPEND ran ${level})
    # A test that fails at a level it reruns at fails the rerun (CMake refuses the test's option).
    rerun(${level} ${CMAKE_COMMAND})
    if(result EQUAL 0 OR NOT out MATCHES "at TAPEGRAD_CPU=${level} failed")
      message(FATAL_ERROR "a failing test at ${level} should fail the rerun, it gave (${result}):\n${out}")
    endif()
  endif()
endforeach()
if(NOT skipped STREQUAL default_level)
  message(FATAL_ERROR "exactly the default level ${default_level} should be skipped, skipped: '${skipped}'")
endif()
message("the reruns ran at '${ran}' and skipped '${skipped}', the default run's level")
