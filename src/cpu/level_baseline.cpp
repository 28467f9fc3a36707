// The kernels compiled for the baseline level: baseline x86-64 (SSE2), or the target's default off x86-64: no extra flags (the flags are set in CMakeLists.txt).
// src/cpu/dispatch.cpp calls this table only when the CPU supports the level.
#include "src/cpu/level_kernels.hpp"

extern "C" const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_baseline() {
    static constexpr tapegrad::cpu_detail::KernelTable table = tapegrad::cpu_detail::table_for(tapegrad::CpuLevel::baseline);
    return &table;
}
