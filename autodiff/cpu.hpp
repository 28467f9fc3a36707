// The compiled part of tapegrad: the float/double kernels (matrix-product row blocks, softmax rows,
// fused attention's tile rows) are compiled once per instruction-set level inside the library
// (src/cpu/), and the best level this CPU supports is chosen at run time, so a user's plain
// Release build gets AVX2 or AVX-512 code without any flag. This header declares the level API
// and the compiled kernels; the header-only code (autodiff/kernels.hpp, ops/fast/) calls them for
// float and double, and keeps its generic loops for every other scalar (the 50-digit type).
// The environment variable TAPEGRAD_CPU=baseline|avx2|avx512 forces a level at start-up.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <vector>

namespace tapegrad {

// Instruction-set levels the kernels are compiled for. baseline: x86-64 (SSE2) or the target's
// default elsewhere; avx2: AVX2 + FMA; avx512: AVX-512 F, DQ, VL and BW (with AVX2 + FMA).
enum class CpuLevel { baseline, avx2, avx512 };

inline constexpr std::array<CpuLevel, 3> all_cpu_levels{CpuLevel::baseline, CpuLevel::avx2, CpuLevel::avx512};

// The word TAPEGRAD_CPU takes for a level (and what benchmarks print as cpu=<level>).
constexpr std::string_view cpu_level_name(CpuLevel level) {
    switch (level) {
        case CpuLevel::baseline: return "baseline";
        case CpuLevel::avx2: return "avx2";
        case CpuLevel::avx512: return "avx512";
    }
    return "unknown";
}

// The level the kernels run at: TAPEGRAD_CPU when set (value_error if the word is unknown or this
// CPU lacks the level), else the best level built into the library that this CPU supports.
CpuLevel cpu_level();
// Whether `level` is built into the library (only baseline off x86-64) and this CPU supports it.
bool cpu_level_available(CpuLevel level);
// The available levels, lowest first.
std::vector<CpuLevel> available_cpu_levels();
// Switches every later kernel call to `level` (tests and benchmarks compare levels in one run);
// value_error when it is not available. Not to be called while kernels run on other threads.
void set_cpu_level(CpuLevel level);

// float and double take the compiled kernels; any other scalar takes the header's generic loops.
template <class T>
inline constexpr bool has_compiled_kernels = std::is_same_v<T, double> || std::is_same_v<T, float>;

namespace kernels {
// The three forms of a matrix product the VJPs need (autodiff/kernels.hpp says which is which).
enum class Form { ab, abT, aTb };
}  // namespace kernels

// The kernels compiled per level, for float and double, each running at cpu_level().
namespace compiled {
// Rows [first, first + rows) of C (m×n) = op(A)·op(B), or += when accumulate, on the calling thread.
void gemm_rows(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const double* A, const double* B,
               double* C, bool accumulate, std::size_t first, std::size_t rows);
void gemm_rows(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const float* A, const float* B,
               float* C, bool accumulate, std::size_t first, std::size_t rows);
// weights = exp(scores − row_max) / Σ exp(scores − row_max), −inf scores giving exactly 0.
void softmax_row(const double* scores, std::size_t n, double row_max, double* weights);
void softmax_row(const float* scores, std::size_t n, float row_max, float* weights);
// dS[k] = weights[k]·(upstream[k] − Σ_j upstream[j]·weights[j]) (softmax's VJP, one row).
void softmax_vjp_row(const double* weights, const double* upstream, std::size_t n, double* dS);
void softmax_vjp_row(const float* weights, const float* upstream, std::size_t n, float* dS);
// x[k] = exp(x[k] − shift).
void exp_shifted(double* x, std::size_t n, double shift);
void exp_shifted(float* x, std::size_t n, float shift);
// x[k] = c·x[k]; returns whether every result is finite.
bool scale_row(double* x, std::size_t n, double c);
bool scale_row(float* x, std::size_t n, float c);
// max(x[0..n)) for n ≥ 1 (NaN when any element is NaN), and Σ x[0..n).
double max_of(const double* x, std::size_t n);
float max_of(const float* x, std::size_t n);
double sum_of(const double* x, std::size_t n);
float sum_of(const float* x, std::size_t n);
// p[k] = c·(p[k]·(dp[k] − mean)).
void score_gradient_row(double* p, const double* dp, std::size_t n, double mean, double c);
void score_gradient_row(float* p, const float* dp, std::size_t n, float mean, float c);
// Whether any of x[0..n) is NaN (the tape's check of every value and gradient it stores).
bool any_nan(const double* x, std::size_t n);
bool any_nan(const float* x, std::size_t n);
// GELU's tanh form (ops/gelu.hpp): y[k] = gelu(a[k]), and da[k] = g[k]·gelu'(a[k]).
void gelu_tanh(const double* a, std::size_t n, double* y);
void gelu_tanh(const float* a, std::size_t n, float* y);
void gelu_tanh_vjp(const double* a, const double* g, std::size_t n, double* da);
void gelu_tanh_vjp(const float* a, const float* g, std::size_t n, float* da);
// n pairs (the value and tangent of n duals, autodiff/dual_kernels.hpp) into two planes,
// first[k] = pairs[2k], second[k] = pairs[2k + 1]; and back (or added to the pairs, when accumulate).
void deinterleave(const double* pairs, std::size_t n, double* first, double* second);
void deinterleave(const float* pairs, std::size_t n, float* first, float* second);
void interleave(const double* first, const double* second, std::size_t n, double* pairs, bool accumulate);
void interleave(const float* first, const float* second, std::size_t n, float* pairs, bool accumulate);
}  // namespace compiled

}  // namespace tapegrad
