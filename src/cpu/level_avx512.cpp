// The kernels compiled for the avx512 level: AVX-512 F/DQ/VL/BW with AVX2 + FMA (the flags are set in CMakeLists.txt).
// src/cpu/dispatch.cpp calls this table only when the CPU supports the level.
#include "src/cpu/level_kernels.hpp"

extern "C" const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_avx512() {
    static constexpr tapegrad::cpu_detail::KernelTable table = tapegrad::cpu_detail::table_for(tapegrad::CpuLevel::avx512);
    return &table;
}
