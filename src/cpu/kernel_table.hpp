// The table of kernels one instruction-set level provides (src/cpu/level_kernels.hpp fills it,
// once per level; src/cpu/dispatch.cpp picks one): the engine's kernels (autodiff/cpu.hpp) and the
// ops' (ops/fast/kernels.hpp), each for double and float. Internal to the library: users reach the
// active level's tables through engine_kernels<T>() and op_kernels<T>().
#pragma once

#include "autodiff/cpu.hpp"
#include "ops/fast/kernels.hpp"

#include <cstddef>

namespace tapegrad::cpu_detail {

struct KernelTable {
    CpuLevel level;
    EngineKernels<double> engine_f64;
    EngineKernels<float> engine_f32;
    OpKernels<double> ops_f64;
    OpKernels<float> ops_f32;
};

}  // namespace tapegrad::cpu_detail

// Each level's one exported symbol (src/cpu/level_<name>.cpp). Everything else in a level's
// object is made local when the library is built (CMakeLists.txt), so the linker can never swap
// one level's copy of an Eigen template for another's.
extern "C" {
const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_baseline();
const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_avx2();
const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_avx512();
const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_avx512_bf16();
}
