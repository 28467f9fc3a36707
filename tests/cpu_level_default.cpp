/// \file
/// Prints the CPU level the kernels take in this environment (autodiff/cpu.hpp's cpu_level(): the
/// best level this CPU supports, or TAPEGRAD_CPU's when set). tests/at_cpu_level.cmake asks it which
/// level a test's default run already covers, so that the rerun forcing that same level is skipped.
#include "autodiff/cpu.hpp"

#include <fmt/core.h>

#include <cstdio>
#include <exception>

int main() {
    try {
        fmt::print("{}\n", tapegrad::cpu_level_name(tapegrad::cpu_level()));
        return 0;
    } catch (const std::exception& e) {
        fmt::print(stderr, "cpu_level_default: {}\n", e.what());
        return 1;
    }
}
