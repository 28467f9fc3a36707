# run_consumer.cmake's MODE=pkgconfig: tests/consumer/main.cpp compiled and linked by plain g++
# with the flags pkg-config gives for the installed tapegrad.pc (no CMake on the consumer's side),
# then run. -ltapegrad takes the shared library, as a linker does when both are installed. Eigen's
# headers are not on the command line: the installed headers must not need them. Fault control: a
# tapegrad.pc whose -L names a folder without the library must make the link fail.
set(prefix ${WORK_DIR}/prefix)
install_library(${prefix})
set(pc_dir ${prefix}/${LIBDIR}/pkgconfig)

function(pkg_config variable pc_path)
  run(${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_path} ${PKG_CONFIG} ${ARGN} tapegrad)
  string(STRIP "${last_output}" flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(${variable} "${flags}" PARENT_SCOPE)
endfunction()

pkg_config(version ${pc_dir} --modversion)
if(NOT version STREQUAL VERSION)
  message(FATAL_ERROR "pkg-config --modversion tapegrad: '${version}', expected ${VERSION}")
endif()
pkg_config(cflags ${pc_dir} --cflags)
pkg_config(libs ${pc_dir} --libs)
message(STATUS "pkg-config --cflags --libs tapegrad: ${cflags} ${libs}")
if("${cflags};${libs}" MATCHES "eigen")
  message(FATAL_ERROR "tapegrad.pc asks for Eigen, which only the compiled library uses: ${cflags} ${libs}")
endif()

set(build ${WORK_DIR}/build)
file(MAKE_DIRECTORY ${build})
run(${CXX_COMPILER} -std=c++20 -O2 ${cflags} -c ${TAPEGRAD_SOURCE_DIR}/tests/consumer/main.cpp -o ${build}/main.o)
run(${CXX_COMPILER} ${build}/main.o ${libs} ${consumer_link_flags} -o ${build}/consumer_shared)
check_links(verdict ${build}/consumer_shared TRUE)
require_holds("${verdict}" "the pkg-config consumer needs libtapegrad.so.${SOVERSION}")
check_loads_from(verdict ${build}/consumer_shared ${prefix}/${LIBDIR})
require_holds("${verdict}" "the pkg-config consumer loads libtapegrad from ${prefix}/${LIBDIR}")
run_consumer_program(${build}/consumer_shared ${prefix}/${LIBDIR})

# Fault control: the same .pc with -L pointing at an empty folder.
set(broken_dir ${WORK_DIR}/broken-pc)
file(READ ${pc_dir}/tapegrad.pc pc)
string(REPLACE "-L\${libdir}" "-L${WORK_DIR}/no-library-here" pc "${pc}")
file(WRITE ${broken_dir}/tapegrad.pc "${pc}")
file(MAKE_DIRECTORY ${WORK_DIR}/no-library-here)
pkg_config(broken_libs ${broken_dir} --libs)
execute_process(COMMAND ${CXX_COMPILER} ${build}/main.o ${broken_libs} ${consumer_link_flags} -o ${build}/consumer_broken
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(result EQUAL 0 OR NOT err MATCHES "cannot find -ltapegrad")
  message(FATAL_ERROR "linking with a tapegrad.pc whose -L is wrong should fail (${broken_libs}):\n${out}\n${err}")
endif()
message(STATUS "fault control rejected, as it should be: a tapegrad.pc with a wrong -L (${broken_libs})")
