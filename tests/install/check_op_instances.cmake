# Checks that a program calling the library's ops on its scalar types links to the library's
# instances instead of compiling the ops itself (autodiff/instances.hpp): compiles
# op_instances_probe.cpp and requires matmul and softmax, and the tape's backward, for double,
# float and mp50 to be undefined (U) in the object, never defined there (W, T). Arguments (-D): CXX_COMPILER, NM,
# SOURCE_DIR, WORK_DIR. Fault control: with FAULT set, the probe is compiled as an instance file
# for float (TAPEGRAD_INSTANTIATE_FOR=float), so the headers declare no extern instance for
# double, and the object must be rejected.
cmake_minimum_required(VERSION 3.20)

include(${CMAKE_CURRENT_LIST_DIR}/../command_output.cmake)

file(MAKE_DIRECTORY ${WORK_DIR})
set(object ${WORK_DIR}/op_instances_probe.o)
set(definitions "")
if(FAULT)
  set(definitions -DTAPEGRAD_INSTANTIATE_FOR=float)
endif()
# -O0: only which symbols the object defines matters, and it compiles fastest.
output_of(ignored ${CXX_COMPILER} -std=c++20 -O0 ${definitions} -I${SOURCE_DIR} -c
          ${CMAKE_CURRENT_LIST_DIR}/op_instances_probe.cpp -o ${object})
output_of(symbols ${NM} -C ${object})
set(mp50 "boost::multiprecision::number<boost::multiprecision::backends::cpp_bin_float<50u")
foreach(instance "tapegrad::matmul<double>(" "tapegrad::softmax<double>(" "tapegrad::matmul<float>("
                 "tapegrad::softmax<float>(" "tapegrad::matmul<${mp50}" "tapegrad::softmax<${mp50}"
                 "tapegrad::Tape<double>::backward(" "tapegrad::Tape<float>::backward("
                 "tapegrad::Tape<${mp50}, (boost::multiprecision::backends::digit_base_type)10, void, int, 0, 0>, (boost::multiprecision::expression_template_option)0> >::backward(")
  string(REGEX REPLACE "([][.*+?^$()|\\\\])" "\\\\\\1" pattern "${instance}")
  if(symbols MATCHES "\n[0-9a-f]+ [TWtw] [^\n]*${pattern}")
    message(FATAL_ERROR "the program defines its own copy of ${instance}...): the op headers' extern "
                        "instances (autodiff/instances.hpp) did not apply")
  endif()
  if(NOT symbols MATCHES "\n +U [^\n]*${pattern}")
    message(FATAL_ERROR "the program does not call the library's ${instance}...)")
  endif()
endforeach()
message(STATUS "the probe takes matmul, softmax and the tape's backward for double, float and mp50 from the library")
