# One row of the option-effect table (tests/cli/CMakeLists.txt), run by CTest as `cmake -P`: an
# option must change what it says it changes. Runs PROGRAM with ARGUMENTS and again with BASELINE
# (the same run without the option; both lists, @WORK@ standing for an empty scratch folder), each
# must exit with EXIT (0 unless the row says otherwise: train_retrieval exits 1 after a run too
# short to reach the held-out accuracy it requires, having printed all a row reads), and the text
# each run shows (stdout, stderr and every file it wrote: a text file's name and content, a binary
# file's name and SHA-256; times removed) must tell them apart:
#   EXPECT  (a regular expression) matches the option's run and not the baseline;
#   ABSENT  matches the baseline and not the option's run (an option that removes output);
#   EXPECT DIFFERS: the two texts differ (an option whose effect has no fixed text, a seed);
#   EXPECT FILES_DIFFER: the files the two runs wrote differ (a setting whose effect is on the
#   trained parameters, where the printed text echoes nothing of it).
cmake_minimum_required(VERSION 3.20)
if(NOT DEFINED EXIT)
  set(EXIT 0)
endif()

# The text a run shows; times ("0.01 s", "seconds": 0.0027) removed, so DIFFERS sees effects only.
function(run_and_read arguments out_var)
  file(REMOVE_RECURSE ${WORK})
  file(MAKE_DIRECTORY ${WORK})
  string(REPLACE "@WORK@" "${WORK}" arguments "${arguments}")
  execute_process(COMMAND ${PROGRAM} ${arguments} WORKING_DIRECTORY ${WORK}
                  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  if(NOT result STREQUAL "${EXIT}")
    message(FATAL_ERROR "${PROGRAM} ${arguments}: exit status ${result}, expected ${EXIT}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  set(files "")
  file(GLOB_RECURSE written ${WORK}/*)
  list(SORT written)
  foreach(path IN LISTS written)
    file(RELATIVE_PATH name ${WORK} ${path})
    if(path MATCHES "\\.(json|txt|dot)$")
      file(READ ${path} content)
      string(APPEND files "\n${name}:\n${content}")
    else()  # a binary file (a checkpoint's .npy, a PNG): its name and its bytes' hash
      file(SHA256 ${path} hash)
      string(APPEND files "\n${name}: sha256 ${hash}")
    endif()
  endforeach()
  set(${out_var}_files "${files}" PARENT_SCOPE)
  set(text "${out}\n${err}${files}")
  string(REGEX REPLACE "[0-9]+\\.?[0-9]* (s|ms)( |,|\n|$)" "" text "${text}")
  string(REGEX REPLACE "\"seconds\": *[-+.0-9eE]+" "" text "${text}")
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

run_and_read("${ARGUMENTS}" with)
run_and_read("${BASELINE}" without)
if(DEFINED ABSENT)
  if(with MATCHES "${ABSENT}" OR NOT without MATCHES "${ABSENT}")
    message(FATAL_ERROR "'${ABSENT}' must be absent from the run with ${ARGUMENTS} and present without "
                        "(${BASELINE})\nwith:\n${with}\nwithout:\n${without}")
  endif()
elseif(EXPECT STREQUAL "FILES_DIFFER")
  if(with_files STREQUAL without_files)
    message(FATAL_ERROR "${ARGUMENTS} wrote the same files as ${BASELINE}:\n${with_files}")
  endif()
elseif(EXPECT STREQUAL "DIFFERS")
  if(with STREQUAL without)
    message(FATAL_ERROR "${ARGUMENTS} shows the same as ${BASELINE}:\n${with}")
  endif()
elseif(NOT with MATCHES "${EXPECT}" OR without MATCHES "${EXPECT}")
  message(FATAL_ERROR "'${EXPECT}' must match the run with ${ARGUMENTS} and not the run without (${BASELINE})"
                      "\nwith:\n${with}\nwithout:\n${without}")
endif()
message(STATUS "the option shows its effect: ${ARGUMENTS} against ${BASELINE}")
