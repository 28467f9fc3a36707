# CTest script: the light umbrella header (tapegrad_record.hpp) compiles none of the 50-digit side:
# the compiler's list of included files (-H) must name neither Boost.Multiprecision nor the
# checker's templates (check/gradcheck.hpp, check/second_order.hpp, autodiff/rerun.hpp,
# autodiff/mp50.hpp) nor fmt/format.h. Run with -DHEADER=tapegrad.hpp as its fault control: the
# full header brings all of them, and the check must say so.
#   cmake -DCXX_COMPILER=... -DSOURCE_DIR=... -DWORK_DIR=... -DHEADER=... -P check_light_header.cmake
file(MAKE_DIRECTORY ${WORK_DIR})
set(source ${WORK_DIR}/light_${HEADER}.cpp)
file(WRITE ${source} "#include \"${HEADER}\"\nint main() { return 0; }\n")
execute_process(COMMAND ${CXX_COMPILER} -std=c++20 -I${SOURCE_DIR} -H -fsyntax-only ${source}
                ERROR_VARIABLE included RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${HEADER} does not compile:\n${included}")
endif()
set(heavy "")
foreach(pattern boost/multiprecision check/gradcheck.hpp check/second_order.hpp autodiff/rerun.hpp autodiff/mp50.hpp
                fmt/format.h)
  string(FIND "${included}" "${pattern}" at)
  if(NOT at EQUAL -1)
    list(APPEND heavy ${pattern})
  endif()
endforeach()
if(heavy)
  message(FATAL_ERROR "${HEADER} includes the heavy side: ${heavy}")
endif()
message(STATUS "${HEADER} includes none of the 50-digit side")
