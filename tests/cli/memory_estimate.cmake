# The memory estimate train_charlm refuses an oversized run with (examples/train_charlm.cpp,
# require_memory_for) must count the transformer's blocks: run as `cmake -P` by CTest, it asks
# PROGRAM for a step of --context 1000000 at --layers 1, 2 and 3 (over 300 GiB at one block, so
# refused on any machine), reads each "needs at least N GiB" and requires the estimate to grow by
# one block's share per layer: the same step from 1 to 2 as from 2 to 3 (to 0.2 GiB: each figure
# is printed to 0.1 GiB, so each is within 0.05 of its value and the second difference within 0.2)
# and each step more than half the estimate at one layer (per position a block keeps at least
# 20·D = 1280 values at the default D = 64, the embedding, final norm, logits and loss a few
# tensors of D or V values, under 2D + 4V = 508 with V ≤ 95 printable characters: a block is over
# 70% of a one-block step). An estimate that ignores --layers gives three equal figures and fails.
cmake_minimum_required(VERSION 3.20)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(tenths "")
foreach(layers 1 2 3)
  execute_process(COMMAND ${PROGRAM} --context 1000000 --layers ${layers} --stop-after 1 --save ${WORK}/checkpoint
                          --curve-data ${WORK}/curve.txt
                  WORKING_DIRECTORY ${WORK} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  if(NOT result STREQUAL "2" OR NOT err MATCHES "--layers ${layers} needs at least ([0-9]+)\\.([0-9]) GiB")
    message(FATAL_ERROR "--layers ${layers}: expected exit status 2 and 'needs at least N.N GiB', got ${result}:\n${err}")
  endif()
  list(APPEND tenths "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
  message(STATUS "--layers ${layers}: ${CMAKE_MATCH_1}.${CMAKE_MATCH_2} GiB")
endforeach()
file(REMOVE_RECURSE ${WORK})
list(GET tenths 0 one)
list(GET tenths 1 two)
list(GET tenths 2 three)
math(EXPR first_step "${two} - ${one}")
math(EXPR second_step "${three} - ${two}")
math(EXPR unevenness "${second_step} - ${first_step}")
if(unevenness LESS -2 OR unevenness GREATER 2)
  message(FATAL_ERROR "the estimate grows unevenly with --layers: ${one}, ${two}, ${three} tenths of a GiB at 1, 2, 3 layers")
endif()
math(EXPR twice_first_step "2 * ${first_step}")
if(NOT twice_first_step GREATER one)
  message(FATAL_ERROR "one more layer adds ${first_step} tenths of a GiB to an estimate of ${one} at one layer: "
                      "less than half of it, so the estimate does not count the layers")
endif()
message(STATUS "the estimate grows by ${first_step} and ${second_step} tenths of a GiB per layer")
