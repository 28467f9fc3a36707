# CTest script: every option PROGRAM lists has a row in the option-effect table (TESTED), or is
# listed in EXEMPT with its reason beside it in tests/cli/CMakeLists.txt; and, for a program with a
# second mode (MODE_OPTION, e.g. --tape), every option that does not belong to that mode (not in
# MODE_ALLOWS) has a refused row with it (MODE_REFUSED). A new option without its rows fails here,
# naming it; so does a row for an option the program no longer has.
# Where the list comes from: PROGRAM --help (its first column), or, with USAGE set, for the
# programs that read their command line by hand (train_retrieval, curvature, the benchmarks), the
# usage line they print when they refuse one: PROGRAM --no-such-option must be refused (exit 2,
# nothing on stdout) with "usage: NAME [steps] [composed|fused] [--threads N]... [T]...", and each
# bracket is one argument: "--name ..." the option --name, bare alternatives ("composed|fused") one
# argument each (choosing one is an effect of its own), anything else its text ("steps").
cmake_minimum_required(VERSION 3.20)
set(listed "")
if(USAGE)
  execute_process(COMMAND ${PROGRAM} --no-such-option RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result STREQUAL "2" OR NOT out STREQUAL "" OR NOT err MATCHES "usage: [^ )\n]+([^)\n]*)")
    message(FATAL_ERROR "${PROGRAM} --no-such-option: exit status ${result} (expected 2), stdout '${out}' "
                        "(expected nothing), and stderr must end with its usage line:\n${err}")
  endif()
  set(help "usage:${CMAKE_MATCH_1}")  # (shown below if something is missing)
  # Brackets become <> first: in a CMake list a "[" would join the elements after it.
  string(REPLACE "[" "<" usage "${CMAKE_MATCH_1}")
  string(REPLACE "]" ">" usage "${usage}")
  string(REGEX MATCHALL "<[^>]*>" found "${usage}")
  foreach(item IN LISTS found)
    string(REGEX REPLACE "^<(.*)>$" "\\1" item "${item}")
    if(item MATCHES "^--([a-z][a-z0-9-]*)")
      list(APPEND listed ${CMAKE_MATCH_1})
    elseif(item MATCHES "^[a-z0-9_]+(\\|[a-z0-9_]+)+$")
      string(REPLACE "|" ";" choices "${item}")
      list(APPEND listed ${choices})
    else()
      list(APPEND listed "${item}")
    endif()
  endforeach()
else()
  execute_process(COMMAND ${PROGRAM} --help RESULT_VARIABLE result OUTPUT_VARIABLE help ERROR_VARIABLE err)
  if(NOT result STREQUAL "0")
    message(FATAL_ERROR "${PROGRAM} --help: exit status ${result}\n${err}")
  endif()
  # The options are the first column: a line "  --name ..." or "  -n [ --name ] ..." (a "--word" in a
  # description, as "tapegrad-check --tape", is not one).
  # (Its brackets go first: in a CMake list an unclosed "[" would join every element after it.)
  string(REPLACE "[" "" help_column "${help}")
  string(REGEX MATCHALL "\n  (-[a-zA-Z]  )?--[a-z][a-z0-9-]*" found "\n${help_column}")
  foreach(item IN LISTS found)
    string(REGEX MATCH "--([a-z][a-z0-9-]*)$" name "${item}")
    list(APPEND listed ${CMAKE_MATCH_1})
  endforeach()
endif()
list(REMOVE_DUPLICATES listed)
set(problems "")
foreach(option IN LISTS listed)
  if(NOT option IN_LIST TESTED AND NOT option IN_LIST EXEMPT)
    string(APPEND problems "'${option}' has no row in the option-effect table; ")
  endif()
  if(MODE_OPTION AND NOT option IN_LIST MODE_ALLOWS AND NOT option IN_LIST MODE_REFUSED)
    string(APPEND problems "--${option} with --${MODE_OPTION}: no refused row; ")
  endif()
endforeach()
foreach(option IN LISTS TESTED EXEMPT MODE_REFUSED)
  if(NOT option IN_LIST listed)
    string(APPEND problems "a row names '${option}', which the program does not list; ")
  endif()
endforeach()
if(NOT problems STREQUAL "")
  message(FATAL_ERROR "${PROGRAM}: ${problems}\n${help}")
endif()
list(LENGTH listed count)
message(STATUS "${PROGRAM}: ${count} options or arguments, each with its rows: ${listed}")
