# output_of(variable command...): runs a command from a `cmake -P` test script and puts its
# standard output in `variable`; a failing command stops the test with its exit code and both
# outputs. Shared by the scripts that check built binaries (check_cpu_levels.cmake and the
# package tests under tests/install/).
function(output_of variable)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "command failed (${result}): ${ARGN}\n${out}\n${err}")
  endif()
  set(${variable} "${out}" PARENT_SCOPE)
endfunction()
