# CTest script: tapegrad-check on a saved tape. The multihead model's tape is saved
# (--save-tape), then checked from the file in full and in fast mode: each must pass and compare as
# many derivatives as the model's own check of the same graph (the generic-lambda form); a copy of
# the file with one value damaged must be refused (exit 1) with the loader's message naming the
# file and the node. Run as
#   cmake -DTOOL=... -DWORK=... -P saved_tape.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(model --model multihead -T 6 -D 8 -H 2)
execute_process(COMMAND ${TOOL} ${model} --save-tape ${WORK}/multihead.json
                OUTPUT_VARIABLE saved RESULT_VARIABLE status)
message(STATUS "save (exit ${status}): ${saved}")
if(NOT status EQUAL 0 OR NOT EXISTS ${WORK}/multihead.json)
  message(FATAL_ERROR "--save-tape did not write the tape")
endif()
foreach(mode full fast)
  set(flags "")
  if(mode STREQUAL "fast")
    set(flags --fast)
  endif()
  execute_process(COMMAND ${TOOL} ${model} ${flags} --quiet OUTPUT_VARIABLE model_report RESULT_VARIABLE model_status)
  execute_process(COMMAND ${TOOL} --tape ${WORK}/multihead.json ${flags} --quiet
                  OUTPUT_VARIABLE tape_report RESULT_VARIABLE tape_status)
  message(STATUS "${mode}, model (exit ${model_status}): ${model_report}")
  message(STATUS "${mode}, saved tape (exit ${tape_status}): ${tape_report}")
  string(REGEX MATCH "[0-9]+ of [0-9]+ derivatives" model_count "${model_report}")
  string(REGEX MATCH "[0-9]+ of [0-9]+ derivatives" tape_count "${tape_report}")
  if(NOT tape_status EQUAL 0 OR NOT tape_report MATCHES "^gradcheck passed")
    message(FATAL_ERROR "the saved tape's ${mode} check did not pass")
  endif()
  if(NOT model_count STREQUAL tape_count OR model_count STREQUAL "")
    message(FATAL_ERROR "the saved tape's ${mode} check compared '${tape_count}', the model's '${model_count}'")
  endif()
endforeach()
# One value damaged (the first leaf's first value made text that is no number).
file(READ ${WORK}/multihead.json text)
string(REGEX REPLACE "\"values\":\\[\"[^\"]*\"" "\"values\":[\"damaged\"" damaged "${text}")
file(WRITE ${WORK}/damaged.json "${damaged}")
execute_process(COMMAND ${TOOL} --tape ${WORK}/damaged.json --quiet ERROR_VARIABLE errors RESULT_VARIABLE status)
message(STATUS "damaged (exit ${status}): ${errors}")
if(NOT status EQUAL 1 OR NOT errors MATCHES "load_tape: .*damaged.json: node 0 \\(leaf\\): value 0 \"damaged\" is not a float64")
  message(FATAL_ERROR "the damaged tape was not refused with the loader's message")
endif()
