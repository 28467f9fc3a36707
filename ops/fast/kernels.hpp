/// \file
/// The ops' compiled kernels: the float/double row kernels of softmax (ops/fast/softmax_rows.hpp),
/// fused attention (ops/fast/fused_attention_rows.hpp), GELU (ops/gelu.hpp), silu (ops/silu.hpp)
/// and rms_norm (ops/rms_norm.hpp),
/// compiled once per
/// instruction-set level with the engine's (autodiff/cpu.hpp) and run at cpu_level(). Declared here,
/// beside the ops that call them, so an op's kernel is added without touching autodiff/: a field
/// here, its Eigen code and its line of the table in src/cpu/level_kernels.hpp.
#pragma once

#include "autodiff/cpu.hpp"

#include <cstddef>

namespace tapegrad {

template <class T>
struct OpKernels {
    /// weights = exp(scores − row_max) / Σ exp(scores − row_max), −inf scores giving exactly 0.
    void (*softmax_row)(const T* scores, std::size_t n, T row_max, T* weights);
    /// dS[k] = weights[k]·(upstream[k] − Σ_j upstream[j]·weights[j]) (softmax's VJP, one row).
    void (*softmax_vjp_row)(const T* weights, const T* upstream, std::size_t n, T* dS);
    /// x[k] = exp(x[k] − shift).
    void (*exp_shifted)(T* x, std::size_t n, T shift);
    /// x[k] = c·x[k]; returns whether every result is finite.
    bool (*scale_row)(T* x, std::size_t n, T c);
    /// max(x[0..n)) for n ≥ 1 (NaN when any element is NaN), and Σ x[0..n).
    T (*max_of)(const T* x, std::size_t n);
    T (*sum_of)(const T* x, std::size_t n);
    /// p[k] = c·(p[k]·(dp[k] − mean)) (softmax's VJP, then the scale's, on a fused tile row).
    void (*score_gradient_row)(T* p, const T* dp, std::size_t n, T mean, T c);
    /// GELU's tanh form: y[k] = gelu(a[k]), and da[k] = g[k]·gelu'(a[k]).
    void (*gelu_tanh)(const T* a, std::size_t n, T* y);
    void (*gelu_tanh_vjp)(const T* a, const T* g, std::size_t n, T* da);
    /// silu (ops/silu.hpp): y[k] = a[k]·σ(a[k]), and da[k] = g[k]·(σ(a[k]) + a[k]·σ'(a[k])).
    void (*silu)(const T* a, std::size_t n, T* y);
    void (*silu_vjp)(const T* a, const T* g, std::size_t n, T* da);
    /// rms_norm (ops/rms_norm.hpp), one row of width n: y[k] = g[k]·(x[k]·r), returning
    /// r = 1/√(Σ x²/n + ε); and the row's dX, dx[k] = (r³/n)·(ĝ_k·(S_k + n·ε) − x[k]·P_k) with
    /// ĝ = G∘g, S_k = Σ_{j≠k} x_j², P_k = Σ_{j≠k} ĝ_j·x_j.
    T (*rms_norm_row)(const T* x, const T* g, std::size_t n, T epsilon, T* y);
    void (*rms_norm_vjp_row)(const T* x, const T* g, const T* G, std::size_t n, T r, T epsilon, T* dx);
};

/// The op kernels of the level running now (cpu_level()), for T = float or double.
template <class T>
const OpKernels<T>& op_kernels();
template <>
const OpKernels<double>& op_kernels<double>();
template <>
const OpKernels<float>& op_kernels<float>();

}  // namespace tapegrad
