// The table of kernels one instruction-set level provides (src/cpu/level_kernels.hpp fills it,
// once per level; src/cpu/dispatch.cpp picks one). Internal to the library: users see only the
// functions declared in autodiff/cpu.hpp.
#pragma once

#include "autodiff/cpu.hpp"

#include <cstddef>

namespace tapegrad::cpu_detail {

template <class T>
struct KernelsFor {
    void (*gemm_rows)(kernels::Form, std::size_t m, std::size_t n, std::size_t k, const T* A, const T* B, T* C,
                      bool accumulate, std::size_t first, std::size_t rows);
    void (*softmax_row)(const T* scores, std::size_t n, T row_max, T* weights);
    void (*softmax_vjp_row)(const T* weights, const T* upstream, std::size_t n, T* dS);
    void (*exp_shifted)(T* x, std::size_t n, T shift);
    bool (*scale_row)(T* x, std::size_t n, T c);
    T (*max_of)(const T* x, std::size_t n);
    T (*sum_of)(const T* x, std::size_t n);
    void (*score_gradient_row)(T* p, const T* dp, std::size_t n, T mean, T c);
    bool (*any_nan)(const T* x, std::size_t n);
    void (*gelu_tanh)(const T* a, std::size_t n, T* y);
    void (*gelu_tanh_vjp)(const T* a, const T* g, std::size_t n, T* da);
    void (*deinterleave)(const T* pairs, std::size_t n, T* first, T* second);
    void (*interleave)(const T* first, const T* second, std::size_t n, T* pairs, bool accumulate);
};

struct KernelTable {
    CpuLevel level;
    KernelsFor<double> f64;
    KernelsFor<float> f32;
};

}  // namespace tapegrad::cpu_detail

// Each level's one exported symbol (src/cpu/level_<name>.cpp). Everything else in a level's
// object is made local when the library is built (CMakeLists.txt), so the linker can never swap
// one level's copy of an Eigen template for another's.
extern "C" {
const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_baseline();
const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_avx2();
const tapegrad::cpu_detail::KernelTable* tapegrad_kernels_avx512();
}
