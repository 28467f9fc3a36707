# The user's op through tapegrad's command line (cmake -P): the tape saved by save_softplus_tape is
# checked by tapegrad-check with the op loaded from the project's shared library (--ops), and the
# same file without --ops is refused naming the op; with AUDIT (tapegrad-audit) given, the audit of
# that tape with --ops ranks the op among its nodes. Arguments (-D): SAVE (save_softplus_tape),
# TOOL (tapegrad-check), OPS (the shared library), WORK (a directory), AUDIT (optional).
file(MAKE_DIRECTORY ${WORK})
set(tape ${WORK}/softplus_tape.json)
file(REMOVE ${tape})
execute_process(COMMAND ${SAVE} ${tape} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0 OR NOT EXISTS ${tape})
  message(FATAL_ERROR "save_softplus_tape failed (${code}):\n${out}${err}")
endif()
file(READ ${tape} text)
if(NOT text MATCHES "\"op\": ?\"user:softplus\"")
  message(FATAL_ERROR "the saved tape does not name the op user:softplus:\n${text}")
endif()

execute_process(COMMAND ${TOOL} --tape ${tape} --ops ${OPS} --quiet RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 0 OR NOT out MATCHES "passed")
  message(FATAL_ERROR "tapegrad-check --ops did not pass the user's tape (exit ${code}):\n${out}${err}")
endif()
message(STATUS "checked with --ops:\n${out}")

# Without the user's ops the tape is refused (exit 1), naming the op and how to load it.
execute_process(COMMAND ${TOOL} --tape ${tape} --quiet RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT code EQUAL 1 OR NOT err MATCHES "user:softplus" OR NOT err MATCHES "--ops")
  message(FATAL_ERROR "without --ops the tape should be refused naming user:softplus (exit ${code}):\n${out}${err}")
endif()
message(STATUS "refused without --ops, as it should be: ${err}")

if(AUDIT)
  execute_process(COMMAND ${AUDIT} --tape ${tape} --ops ${OPS} --quiet RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL 0 OR NOT out MATCHES "softplus")
    message(FATAL_ERROR "tapegrad-audit --ops did not audit the user's tape (exit ${code}):\n${out}${err}")
  endif()
  message(STATUS "audited with --ops:\n${out}")
endif()
