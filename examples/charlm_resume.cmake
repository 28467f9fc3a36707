# Resume test for train_charlm (run by CTest, see examples/CMakeLists.txt): 6 steps in one run,
# against 3 steps, save, load, 3 more. Every checkpoint file of the two runs must be identical.
# TRAINER (the program), ARGUMENTS (the small model's options, a list) and WORK (a scratch
# directory) are given with -D; MODEL, when given, is the family the checkpoint's manifest must name
# (so that a run of another family than asked for cannot pass), DTYPE the dtype it must name.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(train)
  execute_process(COMMAND ${TRAINER} ${ARGUMENTS} --steps 6 --sample-length 0 ${ARGN}
                  RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "train_charlm ${ARGN} failed (${status}):\n${output}")
  endif()
endfunction()
train(--save ${WORK}/whole)
train(--stop-after 3 --save ${WORK}/first_half)
train(--load ${WORK}/first_half --save ${WORK}/resumed)
# The manifest's line for `key` must be "key value" when the caller gave a value.
function(require_manifest_line key value)
  if(NOT value STREQUAL "")
    file(STRINGS ${WORK}/whole/manifest.txt line REGEX "^${key} ")
    if(NOT line STREQUAL "${key} ${value}")
      message(FATAL_ERROR "the checkpoint's manifest says '${line}', not '${key} ${value}'")
    endif()
  endif()
endfunction()
require_manifest_line(model "${MODEL}")
require_manifest_line(dtype "${DTYPE}")
file(GLOB files RELATIVE ${WORK}/whole ${WORK}/whole/*)
list(LENGTH files count)
if(count LESS 10)
  message(FATAL_ERROR "the uninterrupted run saved only ${count} files")
endif()
foreach(name IN LISTS files)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/whole/${name} ${WORK}/resumed/${name}
                  RESULT_VARIABLE different)
  if(different)
    message(FATAL_ERROR "${name} differs between the uninterrupted and the resumed run")
  endif()
endforeach()
# The half-way checkpoint must differ from the end (else the test could not tell a resume from a copy).
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/whole/param.E.npy ${WORK}/first_half/param.E.npy
                RESULT_VARIABLE different)
if(NOT different)
  message(FATAL_ERROR "the checkpoint after 3 steps equals the one after 6")
endif()
file(GLOB leftovers ${WORK}/*.partial ${WORK}/*.previous ${WORK}/*/*.partial-*)
if(leftovers)
  message(FATAL_ERROR "half-written files left behind: ${leftovers}")
endif()
message(STATUS "resume: ${count} files identical after 6 steps and after 3 + 3")
