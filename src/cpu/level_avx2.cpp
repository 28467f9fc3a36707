// The kernels compiled for the avx2 level: AVX2 + FMA (-mavx2 -mfma) (the flags are set in CMakeLists.txt).
// src/cpu/dispatch.cpp calls this table only when the CPU supports the level.
#include "src/cpu/level_kernels.hpp"

extern "C" const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_avx2() {
    static constexpr tapegrad::cpu_detail::KernelTable table = tapegrad::cpu_detail::table_for(tapegrad::CpuLevel::avx2);
    return &table;
}
