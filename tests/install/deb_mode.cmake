# run_consumer.cmake's MODE=deb: the Debian packages built by `cpack -G DEB` from the build tree,
# checked field by field (with a fault control: a package whose Depends lacks libfmt-dev must be
# rejected), unpacked with dpkg-deb -x, and the consumer built against <dir>/usr by find_package
# and run, statically and with the runtime package's libtapegrad.so.
set(runtime_package libtapegrad${SOVERSION})
execute_process(COMMAND dpkg --print-architecture OUTPUT_VARIABLE arch OUTPUT_STRIP_TRAILING_WHITESPACE)
set(runtime_deb ${WORK_DIR}/${runtime_package}_${VERSION}_${arch}.deb)
set(dev_deb ${WORK_DIR}/libtapegrad-dev_${VERSION}_${arch}.deb)

# cpack on the build tree's configuration. With a Makefile generator cpack would first build the
# target `preinstall`, i.e. everything (the whole test suite); this test packages what is built
# (the two components need only tapegrad and tapegrad_shared), so it names a generator that has
# no preinstall step. What goes into the packages is the same install rules either way.
file(WRITE ${WORK_DIR}/CPackConfig.cmake
     "include(\"${TAPEGRAD_BINARY_DIR}/CPackConfig.cmake\")\nset(CPACK_CMAKE_GENERATOR Ninja)\n")
run(${CMAKE_COMMAND} -E chdir ${WORK_DIR} cpack -G DEB --config ${WORK_DIR}/CPackConfig.cmake -B ${WORK_DIR})
foreach(deb ${runtime_deb} ${dev_deb})
  if(NOT EXISTS ${deb})
    message(FATAL_ERROR "cpack did not make ${deb}:\n${last_output}")
  endif()
endforeach()

check_deb_control(verdict ${dev_deb} libtapegrad-dev
                  "${runtime_package} \\(= ${VERSION}\\);libboost-dev;libfmt-dev")
require_holds("${verdict}" "libtapegrad-dev's fields")
check_deb_control(verdict ${runtime_deb} ${runtime_package} "libfmt[0-9]+;libstdc\\+\\+6")
require_holds("${verdict}" "${runtime_package}'s fields")
deb_without_dependency(${dev_deb} libfmt-dev ${WORK_DIR}/broken/libtapegrad-dev.deb)
check_deb_control(verdict ${WORK_DIR}/broken/libtapegrad-dev.deb libtapegrad-dev "libboost-dev;libfmt-dev")
require_rejected("${verdict}" "a libtapegrad-dev without libfmt-dev in Depends")

# The shlibs file: packages built against libtapegrad.so.<SOVERSION> will depend on this package.
run(dpkg-deb --info ${runtime_deb} shlibs)
if(NOT last_output MATCHES "^libtapegrad ${SOVERSION} ${runtime_package} \\(= ${VERSION}\\)")
  message(FATAL_ERROR "${runtime_deb}: unexpected shlibs '${last_output}'")
endif()

set(root ${WORK_DIR}/root)
run(dpkg-deb -x ${runtime_deb} ${root})
run(dpkg-deb -x ${dev_deb} ${root})
require_files(${root}/usr)
build_and_check_consumers(${root}/usr)
