# Runs a kernel test again with TAPEGRAD_CPU=LEVEL (cmake -P; tests/CMakeLists.txt's _cpu_<level>
# reruns), unless LEVEL is the level the test's own default run takes here (PROBE, the program
# cpu_level_default, run in the same environment as that default run): then the rerun would repeat
# that run exactly, the same binary at the same level, so it says so and CTest counts it skipped.
# The forcing itself at every level, the best one included, stays tested by the test_cpu_levels
# reruns, which are not wrapped.
# Arguments (-D): EXECUTABLE, LEVEL, PROBE.
cmake_minimum_required(VERSION 3.20)
execute_process(COMMAND ${PROBE} RESULT_VARIABLE probe_result OUTPUT_VARIABLE default_level
                ERROR_VARIABLE probe_error OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT probe_result EQUAL 0)
  message(FATAL_ERROR "at_cpu_level: ${PROBE} failed (${probe_result}): ${probe_error}")
endif()
if(default_level STREQUAL LEVEL)
  message("TAPEGRAD_CPU=${LEVEL}: the default run's level here; that run covers it")
  return()
endif()
set(ENV{TAPEGRAD_CPU} ${LEVEL})
# No OUTPUT_VARIABLE: the test's output is this script's, so CTest's SKIP_REGULAR_EXPRESSION sees a
# level this CPU lacks.
execute_process(COMMAND ${EXECUTABLE} --report_level=short RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${EXECUTABLE} at TAPEGRAD_CPU=${LEVEL} failed (${result})")
endif()
