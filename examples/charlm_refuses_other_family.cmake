# Refusal test for train_charlm (run by CTest, see examples/CMakeLists.txt): a checkpoint of one
# model family resumed as the other is refused, both ways, and a decoder checkpoint resumed with
# other decoder sizes too: exit status 1, a message naming the checkpoint's family or sizes and the
# run's, nothing trained (nothing on standard output) and nothing saved. TRAINER (the program),
# ARGUMENTS (the small model's options, a list), LLAMA (the decoder's own options, a list, starting
# with --model llama) and WORK (a scratch directory) are given with -D.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(train)
  execute_process(COMMAND ${TRAINER} ${ARGUMENTS} --steps 2 --sample-length 0 ${ARGN}
                  RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "train_charlm ${ARGN} failed (${status}):\n${output}")
  endif()
endfunction()
# refused(MESSAGE ARGUMENTS...): the run must fail with MESSAGE (a regular expression) on stderr.
function(refused expected)
  execute_process(COMMAND ${TRAINER} ${ARGUMENTS} --steps 4 --sample-length 0 --save ${WORK}/refused ${ARGN}
                  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT status EQUAL 1 OR NOT err MATCHES "${expected}" OR NOT out STREQUAL "" OR EXISTS ${WORK}/refused)
    message(FATAL_ERROR "train_charlm ${ARGN}: expected exit status 1, no output, no checkpoint and /${expected}/; "
                        "got ${status}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  message(STATUS "refused: ${ARGN}\n  ${err}")
endfunction()
train(--save ${WORK}/gpt2)
train(${LLAMA} --save ${WORK}/llama)
refused("holds the gpt2 model, this run trains the llama model: resume it with --model gpt2"
        ${LLAMA} --load ${WORK}/gpt2)
refused("holds the llama model, this run trains the gpt2 model: resume it with --model llama" --load ${WORK}/llama)
refused("is for another model or corpus \\(checkpoint: llama [^;]*kv_heads 1[^;]*; this run: llama [^)]*kv_heads 2"
        ${LLAMA} --kv-heads 2 --load ${WORK}/llama)
file(REMOVE_RECURSE ${WORK})
