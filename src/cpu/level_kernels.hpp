// The float/double kernels, written once with Eigen (the bfloat16 product's emulation, without:
// src/cpu/bf16_product.hpp) and compiled once per instruction-set level:
// each src/cpu/level_<name>.cpp includes this file and is compiled with that level's flags.
// Everything here has internal linkage (anonymous namespace) and the Eigen templates it
// instantiates are localised in each level's object by the build (CMakeLists.txt), so each level
// runs its own code. Included by those files only.
// REPRODUCIBLE: a result never depends on where a buffer lies in memory. Eigen, given an unaligned
// buffer, computes the elements before the first aligned address with its scalar path (std::exp,
// a sum in another order, a dot product for a tiny product), whose rounding differs from the
// packet path's; with 32- and 64-byte packets malloc's 16-byte alignment no longer fixes that
// split. So elementwise exp goes through an aligned block, sums are added in a fixed order, and
// tiny products (where Eigen would take its coefficient-wise path) are plain loops.
#pragma once

#include "autodiff/low_precision.hpp"
#include "src/cpu/bf16_product.hpp"
#include "src/cpu/kernel_table.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <type_traits>

namespace tapegrad::cpu_detail {
namespace {

// Blocks with k + rows + cols below this go through small_product (Eigen's own threshold for its
// coefficient-wise path, EIGEN_GEMM_TO_COEFFBASED_THRESHOLD): below it the blocked GEMM's set-up
// costs more than the product.
constexpr std::size_t small_product_size = 20;

// A block of C (+)= op(A)·op(B) by plain loops, each C entry summed over p in order (no
// reassociation, so the same bits wherever the buffers lie).
template <class T>
void small_product(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const T* A, const T* B, T* C,
                   bool accumulate, kernels::Block block) {
    for (std::size_t i = block.first_row; i < block.first_row + block.rows; ++i)
        for (std::size_t j = block.first_col; j < block.first_col + block.cols; ++j) {
            T dot = 0;
            for (std::size_t p = 0; p < k; ++p) {
                const T a = form == kernels::Form::aTb ? A[p * m + i] : A[i * k + p];
                const T b = form == kernels::Form::abT ? B[j * k + p] : B[p * n + j];
                dot += a * b;
            }
            C[i * n + j] = accumulate ? C[i * n + j] + dot : dot;
        }
}

// A block of C (m×n) = op(A)·op(B) or += (row-major buffers):
// ab: A is m×k, B is k×n.  abT: A is m×k, B is n×k.  aTb: A is k×m, B is k×n.
template <class T>
void gemm_block(kernels::Form form, std::size_t m, std::size_t n, std::size_t k, const T* A, const T* B, T* C,
                bool accumulate, kernels::Block block) {
    if (k + block.rows + block.cols < small_product_size) {
        small_product(form, m, n, k, A, B, C, accumulate, block);
        return;
    }
    using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using ConstMap = Eigen::Map<const Matrix>;
    const auto mi = Eigen::Index(m), ni = Eigen::Index(n), ki = Eigen::Index(k);
    const auto i0 = Eigen::Index(block.first_row), rows = Eigen::Index(block.rows);
    const auto j0 = Eigen::Index(block.first_col), cols = Eigen::Index(block.cols);
    auto c_block = Eigen::Map<Matrix>(C, mi, ni).block(i0, j0, rows, cols);
    const auto product = [&](const auto& expression) {
        if (accumulate) {
            c_block.noalias() += expression;
        } else {
            c_block.noalias() = expression;
        }
    };
    switch (form) {
        case kernels::Form::ab:
            product(ConstMap(A, mi, ki).middleRows(i0, rows) * ConstMap(B, ki, ni).middleCols(j0, cols));
            break;
        case kernels::Form::abT:
            product(ConstMap(A, mi, ki).middleRows(i0, rows) * ConstMap(B, ni, ki).middleRows(j0, cols).transpose());
            break;
        case kernels::Form::aTb:
            product(ConstMap(A, ki, mi).middleCols(i0, rows).transpose() * ConstMap(B, ki, ni).middleCols(j0, cols));
            break;
    }
}

// Σ term(j) for j in [0, n) added in one fixed order: 16 running sums (term j goes to sum j mod 16;
// the compiler vectorises them at every level's width), then combined pairwise.
template <class T, class Term>
T sum_terms_in_fixed_order(std::size_t n, const Term& term) {
    constexpr std::size_t lanes = 16;
    std::array<T, lanes> partial{};
    std::size_t j = 0;
    for (; j + lanes <= n; j += lanes)
        for (std::size_t l = 0; l < lanes; ++l) partial[l] += term(j + l);
    for (std::size_t l = 0; j < n; ++j, ++l) partial[l] += term(j);
    for (std::size_t width = lanes / 2; width > 0; width /= 2)
        for (std::size_t l = 0; l < width; ++l) partial[l] += partial[l + width];
    return partial[0];
}

template <class T>
T sum_in_fixed_order(const T* x, std::size_t n) {
    return sum_terms_in_fixed_order<T>(n, [x](std::size_t j) { return x[j]; });
}

// x[k] = exp(x[k] − shift), each element through Eigen's packet exp: blocks of 64 are copied into
// an aligned buffer, so no element takes the scalar path. The tail goes in blocks of 16 (the padding
// computes exp(0)): a packet computes each lane alone, so the bits are those of the 64-block, and a
// short row (T = 2) pays for 16 exponentials, not 64.
template <class T, std::size_t block>
void exp_shifted_block(T* x, std::size_t count, T shift) {
    alignas(64) std::array<T, block> buffer;
    std::copy_n(x, count, buffer.begin());
    std::fill(buffer.begin() + count, buffer.end(), shift);
    Eigen::Map<Eigen::Array<T, block, 1>, Eigen::Aligned64> a(buffer.data());
    a = (a - shift).exp();
    std::copy_n(buffer.begin(), count, x);
}

template <class T>
void exp_shifted(T* x, std::size_t n, T shift) {
    constexpr std::size_t block = 64, tail_block = 16;
    std::size_t start = 0;
    for (; start + block <= n; start += block) exp_shifted_block<T, block>(x + start, block, shift);
    for (; start < n; start += tail_block) {
        exp_shifted_block<T, tail_block>(x + start, std::min(tail_block, n - start), shift);
    }
}

template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// Eigen's vectorised exp is within an ulp or two of std::exp. It clamps −inf to a tiny number,
// so hidden positions are set to exactly 0 before the division.
template <class T>
void softmax_row(const T* scores, std::size_t n, T row_max, T* weights) {
    std::copy_n(scores, n, weights);
    exp_shifted(weights, n, row_max);
    for (std::size_t j = 0; j < n; ++j)
        if (scores[j] == -std::numeric_limits<T>::infinity()) weights[j] = T(0);
    const T total = sum_in_fixed_order(weights, n);
    for (std::size_t j = 0; j < n; ++j) weights[j] /= total;
}

// Softmax's VJP for one row (ops/softmax.hpp): dS_j = A_j·(G_j − Σ_k G_k A_k), the mean summed in a
// fixed order.
template <class T>
void softmax_vjp_row(const T* weights, const T* upstream, std::size_t n, T* dS) {
    const T mean = sum_terms_in_fixed_order<T>(n, [&](std::size_t j) { return upstream[j] * weights[j]; });
    for (std::size_t k = 0; k < n; ++k) dS[k] = weights[k] * (upstream[k] - mean);
}

template <class T>
bool scale_row(T* x, std::size_t n, T c) {
    ArrayMap<T> a(x, Eigen::Index(n));
    a *= c;
    return a.isFinite().all();
}

// NaN when any element is NaN (a finite result proves the row has no NaN and no +inf).
template <class T>
T max_of(const T* x, std::size_t n) {
    return ConstArrayMap<T>(x, Eigen::Index(n)).template maxCoeff<Eigen::PropagateNaN>();
}

template <class T>
T sum_of(const T* x, std::size_t n) {
    return sum_in_fixed_order(x, n);
}

template <class T>
void score_gradient_row(T* p, const T* dp, std::size_t n, T mean, T c) {
    ArrayMap<T> a(p, Eigen::Index(n));
    a = c * (a * (ConstArrayMap<T>(dp, Eigen::Index(n)) - mean));
}

// Whether any of x[0..n) is NaN (±inf is not). A count rather than an early exit, so the loop is
// one vector compare per packet at the AVX2 and AVX-512 levels.
template <class T>
bool any_nan(const T* x, std::size_t n) {
    std::size_t count = 0;
    for (std::size_t k = 0; k < n; ++k) count += (x[k] != x[k]);
    return count != 0;
}

// The value and tangent planes of n duals stored as pairs, and back (autodiff/dual_kernels.hpp
// splits the operands of a dual product and merges its result). Plain loops: at the AVX2 and
// AVX-512 levels the compiler makes them shuffles of whole registers: 1.6-2.1 times the speed of
// the baseline's 2-element ones on 4096 pairs of doubles (the size of a T = 64 attention's tensors).
template <class T>
void deinterleave(const T* pairs, std::size_t n, T* first, T* second) {
    for (std::size_t k = 0; k < n; ++k) {
        first[k] = pairs[2 * k];
        second[k] = pairs[2 * k + 1];
    }
}

template <class T>
void interleave(const T* first, const T* second, std::size_t n, T* pairs, bool accumulate) {
    if (accumulate) {
        for (std::size_t k = 0; k < n; ++k) {
            pairs[2 * k] += first[k];
            pairs[2 * k + 1] += second[k];
        }
    } else {
        for (std::size_t k = 0; k < n; ++k) {
            pairs[2 * k] = first[k];
            pairs[2 * k + 1] = second[k];
        }
    }
}

// GELU's tanh form, as ops/gelu.hpp writes it, through the identity ½·(1 + tanh u) = σ(2u):
//   s = 1 / (1 + e^{−2u}),  u = c·(a + k·a³),  y = a·s,
//   dy/da = ½(1 + t) + ½·a·(1 − t²)·c·(1 + 3k·a²) = s + a·2s(1 − s)·c·(1 + 3k·a²)   (t = 2s − 1).
// No cancellation for either sign of u (1 + tanh u would lose digits for u ≪ 0), and a huge
// e^{−2u} (Eigen's exp saturates near the largest double) gives s ≈ 0, never NaN. Each block of
// 64 goes through an aligned buffer, as in exp_shifted, so every element takes Eigen's packet exp.
template <class T>
struct GeluTanhBlock {
    static constexpr std::size_t size = 64;
    static constexpr T c = T(0.7978845608028654);  // √(2/π)
    static constexpr T k = T(0.044715);
    using Values = Eigen::Array<T, size, 1>;
    using ConstMap = Eigen::Map<const Values, Eigen::Aligned64>;
    alignas(64) std::array<T, size> a, g;

    // Copies `count` elements of x into `to`, padding the block with zeros.
    static void load(const T* x, std::size_t count, std::array<T, size>& to) {
        std::fill(std::copy_n(x, count, to.begin()), to.end(), T(0));
    }
    Values gate() const {  // s = σ(2u) for each element of a
        const ConstMap A(a.data());
        const Values u = c * (A + k * A * A * A);
        return T(1) / (T(1) + (T(-2) * u).exp());
    }
};

template <class T>
void gelu_tanh(const T* a, std::size_t n, T* y) {
    using Block = GeluTanhBlock<T>;
    Block block;
    for (std::size_t start = 0; start < n; start += Block::size) {
        const std::size_t count = std::min(Block::size, n - start);
        Block::load(a + start, count, block.a);
        const typename Block::Values Y = typename Block::ConstMap(block.a.data()) * block.gate();
        std::copy_n(Y.data(), count, y + start);
    }
}

// dA = G ∘ dy/da.
template <class T>
void gelu_tanh_vjp(const T* a, const T* g, std::size_t n, T* da) {
    using Block = GeluTanhBlock<T>;
    Block block;
    for (std::size_t start = 0; start < n; start += Block::size) {
        const std::size_t count = std::min(Block::size, n - start);
        Block::load(a + start, count, block.a);
        Block::load(g + start, count, block.g);
        const typename Block::ConstMap A(block.a.data()), G(block.g.data());
        const typename Block::Values s = block.gate();
        // Where s is exactly 0 or 1 the term is 0·(…), but for |a| past about 5e19 (float) or 4e154
        // (double) its factors a·2 and 1 + 3k·a² overflow and ∞·0 made a finite input's slope NaN:
        // there the slope is s. ±inf keeps the formula's ∞·0 = NaN, as ops/gelu.hpp's loop gives.
        const typename Block::Values slope =
            ((s == T(0) || s == T(1)) && A.isFinite())
                .select(s, s + A * T(2) * s * (T(1) - s) * Block::c * (T(1) + T(3) * Block::k * A * A));
        const typename Block::Values dA = G * slope;
        std::copy_n(dA.data(), count, da + start);
    }
}

// silu, as ops/silu.hpp writes it, with e = e^(−|a|) the only exponential (never overflows):
//   σ = 1/(1 + e) for a ≥ 0, e/(1 + e) below;  y = a·σ;  dy/da = σ + a·σ',  σ' = e/(1 + e)².
// e is taken as (e^(−|a|/2))²: Eigen's packet exp clamps its argument near the smallest normal's
// logarithm (−708 in double), so e^(−1e4) would come out ~5e-309 instead of 0 and silu(−1e4) ~−5e-305
// instead of −0; the half never reaches the clamp before its square underflows, as std::exp's
// result does. One more rounding (within 3 ulps of e^(−|a|) in all).
// Blocks of 64 through aligned buffers, as GELU's, so every element takes Eigen's packet exp.
template <class T>
struct SiluBlock {
    static constexpr std::size_t size = 64;
    using Values = Eigen::Array<T, size, 1>;
    using ConstMap = Eigen::Map<const Values, Eigen::Aligned64>;
    alignas(64) std::array<T, size> a, g;

    static void load(const T* x, std::size_t count, std::array<T, size>& to) {
        std::fill(std::copy_n(x, count, to.begin()), to.end(), T(0));
    }
    // σ(a) and σ'(a) for each element of a.
    void gate(Values& sigma, Values& slope) const {
        const ConstMap A(a.data());
        const Values half = (T(-0.5) * A.abs()).exp(), e = half * half, r = T(1) / (T(1) + e);
        sigma = (A >= T(0)).select(r, e * r);
        slope = e * r * r;
    }
};

template <class T>
void silu(const T* a, std::size_t n, T* y) {
    using Block = SiluBlock<T>;
    Block block;
    typename Block::Values sigma, slope;
    for (std::size_t start = 0; start < n; start += Block::size) {
        const std::size_t count = std::min(Block::size, n - start);
        Block::load(a + start, count, block.a);
        block.gate(sigma, slope);
        const typename Block::Values Y = typename Block::ConstMap(block.a.data()) * sigma;
        std::copy_n(Y.data(), count, y + start);
    }
}

template <class T>
void silu_vjp(const T* a, const T* g, std::size_t n, T* da) {
    using Block = SiluBlock<T>;
    Block block;
    typename Block::Values sigma, slope;
    for (std::size_t start = 0; start < n; start += Block::size) {
        const std::size_t count = std::min(Block::size, n - start);
        Block::load(a + start, count, block.a);
        Block::load(g + start, count, block.g);
        block.gate(sigma, slope);
        const typename Block::ConstMap A(block.a.data()), G(block.g.data());
        const typename Block::Values dA = G * (sigma + A * slope);
        std::copy_n(dA.data(), count, da + start);
    }
}

// rms_norm's forward on one row (ops/rms_norm.hpp): r = 1/√(Σ x²/n + ε), y = g·(x·r); returns r.
template <class T>
T rms_norm_row(const T* x, const T* g, std::size_t n, T epsilon, T* y) {
    const T squares = sum_terms_in_fixed_order<T>(n, [x](std::size_t j) { return x[j] * x[j]; });
    const T r = T(1) / std::sqrt(squares / T(n) + epsilon);
    for (std::size_t j = 0; j < n; ++j) y[j] = g[j] * (x[j] * r);
    return r;
}

// rms_norm's dX on one row: dx_j = (r³/n)·(ĝ_j·(S_j + n·ε) − x_j·P_j), ĝ = G∘g, S_j and P_j the
// sums of x_k² and ĝ_k·x_k over k ≠ j, each taken as the row's total less j's own term, except at
// an element whose x_j² is more than half of Σ x² (one at most: a dominant element, a row of width
// 1), whose two sums are taken over the others directly, as the generic loop's prefix and suffix
// sums take every one (ops/rms_norm.hpp says what the total would lose there). Elsewhere
// x_j² ≤ S_j, so S less x_j² loses at most a bit of S_j, and P less ĝ_j·x_j adds at most
// u·|ĝ_j·x_j| to P_j: times x_j, at most u·|ĝ_j|·S_j, a rounding of the first term. The two totals
// are sums in the fixed order (vectorised); the rest is elementwise. The bits differ between levels
// in the last place (a test asserting equal bits failed, 2026-12-07: each level's code generation,
// fused multiply-adds among it); tests/test_cpu_levels.cpp holds each level to 50 digits.
template <class T>
void rms_norm_vjp_row(const T* x, const T* g, const T* G, std::size_t n, T r, T epsilon, T* dx) {
    const auto square = [x](std::size_t j) { return x[j] * x[j]; };
    const auto term = [x, g, G](std::size_t j) { return (G[j] * g[j]) * x[j]; };
    const T S = sum_terms_in_fixed_order<T>(n, square), P = sum_terms_in_fixed_order<T>(n, term);
    const T scale = r * r * r / T(n), n_epsilon = T(n) * epsilon;
    const auto dx_of = [&](std::size_t j, T S_j, T P_j) {
        return scale * ((G[j] * g[j]) * (S_j + n_epsilon) - x[j] * P_j);
    };
    for (std::size_t j = 0; j < n; ++j) dx[j] = dx_of(j, S - square(j), P - term(j));
    const auto over_others = [n](std::size_t j, const auto& f) {
        return sum_terms_in_fixed_order<T>(j, f) +
               sum_terms_in_fixed_order<T>(n - j - 1, [j, &f](std::size_t k) { return f(j + 1 + k); });
    };
    for (std::size_t j = 0; j < n; ++j) {
        if (T(2) * square(j) > S) dx[j] = dx_of(j, over_others(j, square), over_others(j, term));
    }
}

// The bfloat16 product (float's table only): at these levels, vdpbf16ps emulated (src/cpu/bf16_product.hpp).
template <class T>
constexpr auto bf16_product_for() {
    if constexpr (std::is_same_v<T, float>) {
        return &gemm_bf16_block<EmulatedBf16Tile>;
    } else {
        return kernels::Absent{};
    }
}

// Floats rounded to bfloat16: the packing's round_run (src/cpu/bf16_product.hpp), bfloat16_from_float's
// integer steps, which the compiler vectorises at this level's width (avx512_bf16 reuses avx512's:
// its vcvtneps2bf16 flushes subnormals, which this rounding keeps).
template <class T>
constexpr auto bf16_rounding_for() {
    if constexpr (std::is_same_v<T, float>) {
        return &round_run;
    } else {
        return kernels::Absent{};
    }
}

// This level's tables, filled by name.
template <class T>
constexpr EngineKernels<T> engine_kernels_for() {
    return {.gemm_block = &gemm_block<T>,
            .any_nan = &any_nan<T>,
            .deinterleave = &deinterleave<T>,
            .interleave = &interleave<T>,
            .gemm_bf16_block = bf16_product_for<T>(),
            .round_to_bf16 = bf16_rounding_for<T>()};
}

template <class T>
constexpr OpKernels<T> op_kernels_for() {
    return {.softmax_row = &softmax_row<T>,
            .softmax_vjp_row = &softmax_vjp_row<T>,
            .exp_shifted = &exp_shifted<T>,
            .scale_row = &scale_row<T>,
            .max_of = &max_of<T>,
            .sum_of = &sum_of<T>,
            .score_gradient_row = &score_gradient_row<T>,
            .gelu_tanh = &gelu_tanh<T>,
            .gelu_tanh_vjp = &gelu_tanh_vjp<T>,
            .silu = &silu<T>,
            .silu_vjp = &silu_vjp<T>,
            .rms_norm_row = &rms_norm_row<T>,
            .rms_norm_vjp_row = &rms_norm_vjp_row<T>};
}

// The table this level's file exports.
constexpr KernelTable table_for(CpuLevel level) {
    return {.level = level,
            .engine_f64 = engine_kernels_for<double>(),
            .engine_f32 = engine_kernels_for<float>(),
            .ops_f64 = op_kernels_for<double>(),
            .ops_f32 = op_kernels_for<float>()};
}

}  // namespace
}  // namespace tapegrad::cpu_detail
