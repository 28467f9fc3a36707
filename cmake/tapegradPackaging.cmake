# Debian packages of the library (included at the end of CMakeLists.txt; `cpack -G DEB` in the
# build directory, after building tapegrad and tapegrad_shared). Two packages, as Debian splits a
# library, from the two install components:
#   libtapegrad<soversion>  (runtime) libtapegrad.so.<soversion> and the file it points to;
#                           its dependencies (libfmt9, libstdc++6, libc6, ...) are read from the
#                           library by dpkg-shlibdeps, so they follow the machine that builds it.
#   libtapegrad-dev         (dev) headers, libtapegrad.a, the libtapegrad.so link, CMake package
#                           config, tapegrad.pc; it needs the runtime package of the same version
#                           and the -dev packages whose headers tapegrad's headers include.
# The runtime package's name carries the soname's version (Debian policy 8.1): 0.1 and 0.2 differ
# in ABI (CMakeLists.txt, TAPEGRAD_SOVERSION), so both can be installed side by side.
set(TAPEGRAD_PACKAGE_MAINTAINER "tapegrad developers <dev@tapegrad.invalid>" CACHE STRING
    "Maintainer field of the Debian packages (name <email>)")

set(CPACK_PACKAGE_NAME tapegrad)
set(CPACK_PACKAGE_VENDOR tapegrad)
set(CPACK_PACKAGE_CONTACT "${TAPEGRAD_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "C++20 reverse-mode autodiff for attention graphs, with a 50-digit gradient checker")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)

set(tapegrad_runtime_package libtapegrad${TAPEGRAD_SOVERSION})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME ${tapegrad_runtime_package})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
# A shlibs file (so packages built against it depend on it) and the ldconfig trigger; "=" because
# any other version may have another ABI while tapegrad is 0.x.
# (CMake 3.25 reads GENERATE_SHLIBS for all packages at once; only the runtime one has an ELF
# shared object, the -dev package's libtapegrad.so being a link.)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "tapegrad's compiled kernels (shared library)\nThe float and double kernels of tapegrad, compiled for baseline x86-64, AVX2+FMA\nand AVX-512, the best level chosen at run time (TAPEGRAD_CPU forces one).")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libtapegrad-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# Boost's header-only libraries and fmt are included by tapegrad's headers; Eigen is not (it is
# compiled into the kernels), so libeigen3-dev is not needed.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "${tapegrad_runtime_package} (= ${PROJECT_VERSION}), libboost-dev (>= 1.74), libfmt-dev")
# Certified gradients (check/certify.hpp, tapegrad::certify, tapegrad-certify.pc) need MPFI; a
# consumer that never certifies does not, so it is suggested, not required.
set(CPACK_DEBIAN_DEV_PACKAGE_SUGGESTS "libmpfi-dev, libmpfr-dev")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "tapegrad: reverse-mode autodiff for attention graphs (development files)\nHeaders, the static library, the CMake package config (find_package(tapegrad))\nand the pkg-config file (pkg-config tapegrad).")

include(CPack)
