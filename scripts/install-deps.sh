#!/usr/bin/env bash
# Installs what tapegrad needs to build and test on Debian (bookworm or later), from Debian's
# packages only (Open MPI and Boost.MPI are optional: without them TAPEGRAD_WITH_MPI is OFF).
# Uses sudo when not run as root.
set -euo pipefail
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
  g++ cmake make libboost-dev libboost-test-dev libboost-program-options-dev libfmt-dev libeigen3-dev \
  libboost-mpi-dev openmpi-bin python3-torch python3-numpy fortunes gnuplot-nox dpkg-dev pkgconf \
  clang-14 libclang-rt-14-dev nlohmann-json3-dev doxygen libmpfi-dev libmpfr-dev ccache mold qemu-user >/dev/null
# libboost-mpi-dev, openmpi-bin: the distributed check and data-parallel training (TAPEGRAD_WITH_MPI);
# python3-torch, python3-numpy: the PyTorch cross-check (tests/torch); fortunes: the char-LM's
# corpus (examples/train_charlm, its CTest runs); gnuplot-nox: its curve picture (optional at run time);
# clang-14, libclang-rt-14-dev: the second compiler (the Clang consumer test, .ci/run's sanitizer
# build) and libFuzzer (fuzz/run.sh); nlohmann-json3-dev: saved tapes' JSON (src/io/tape_file.cpp, in the
# library only); doxygen: the API reference (the `docs` target, built by .ci/run); libmpfi-dev,
# libmpfr-dev: interval arithmetic for certified gradients (check/certify.hpp, the target
# tapegrad::certify: optional, linked only by the programs that certify); ccache: .ci/run compiles
# through it, so that a translation unit compiled twice with the same flags in one run (the library
# in the Release tree and again in the add_subdirectory consumer test) is compiled once; mold: .ci/run
# links its sanitizer trees with it (a test's link: GNU ld about 2 s, mold a fraction of that);
# qemu-user: CTest runs the CPU-level dispatch under an emulated CPU without AVX-512 (tests/CMakeLists.txt).
