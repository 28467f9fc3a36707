/// \file
/// Row kernels of the fused attention op (ops/fused_attention.hpp), here only for speed: the
/// elementwise work on a tile row (exp above all) would otherwise cost as much as the tile products.
/// float and double go to the library's compiled kernels (Eigen's vectorised arrays, compiled per
/// instruction-set level: autodiff/cpu.hpp); any other scalar (the 50-digit reference
/// type) takes a plain loop with the ADL functions of its own precision.
/// INVARIANT: each kernel computes the same expression per element as its plain loop and as the
/// composed graph's ops, so the vectorised results equal the generic ones to rounding (Eigen's exp
/// is within an ulp or two of std::exp; sums may be added in a different order).
#pragma once

#include "autodiff/cpu.hpp"
#include "autodiff/tensor.hpp"
#include "ops/fast/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace tapegrad::fused_detail {

template <Scalar T>
inline constexpr bool vectorised = has_compiled_kernels<T>;

/// x[k] = exp(x[k] − shift) for k < n.
template <Scalar T>
void exp_shifted(T* x, std::size_t n, const T& shift) {
    if constexpr (vectorised<T>) {
        op_kernels<T>().exp_shifted(x, n, shift);
    } else {
        using std::exp;
        for (std::size_t k = 0; k < n; ++k) x[k] = exp(T(x[k] - shift));
    }
}

/// The first k < n with x[k] not finite, or n. float and double first count the elements that are
/// not within ±max (NaN compares false) in a loop the compiler vectorises, so an input of finite
/// values (every call but a refused one) takes no branch per element.
template <Scalar T>
std::size_t first_not_finite(const T* x, std::size_t n) {
    if constexpr (vectorised<T>) {
        std::size_t outside = 0;
        for (std::size_t k = 0; k < n; ++k) outside += !(std::abs(x[k]) <= std::numeric_limits<T>::max());
        if (outside == 0) return n;
    }
    for (std::size_t k = 0; k < n; ++k)
        if (!is_finite(x[k])) return k;
    return n;
}

/// x[k] = c·x[k] for k < n; returns the first k with a non-finite result, or n.
template <Scalar T>
std::size_t scale_checked(T* x, std::size_t n, const T& c) {
    if constexpr (vectorised<T>) {
        if (op_kernels<T>().scale_row(x, n, c)) return n;
    } else {
        for (std::size_t k = 0; k < n; ++k) x[k] = T(c * x[k]);
    }
    return first_not_finite(x, n);
}

/// max(start, x[0..n)).
template <Scalar T>
T max_of(const T* x, std::size_t n, const T& start) {
    if constexpr (vectorised<T>) {
        return n == 0 ? start : std::max(start, op_kernels<T>().max_of(x, n));
    } else {
        T best = start;
        for (std::size_t k = 0; k < n; ++k) best = shift_max(best, x[k]);  // (a shift: autodiff/dual.hpp)
        return best;
    }
}

/// Σ x[0..n).
template <Scalar T>
T sum_of(const T* x, std::size_t n) {
    if constexpr (vectorised<T>) {
        return op_kernels<T>().sum_of(x, n);
    } else {
        T total(0);
        for (std::size_t k = 0; k < n; ++k) total += x[k];
        return total;
    }
}

/// p[k] = c·(p[k]·(dp[k] − mean)) for k < n: softmax's VJP, then the scale's.
template <Scalar T>
void score_gradient_row(T* p, const T* dp, std::size_t n, const T& mean, const T& c) {
    if constexpr (vectorised<T>) {
        op_kernels<T>().score_gradient_row(p, dp, n, mean, c);
    } else {
        for (std::size_t k = 0; k < n; ++k) p[k] = T(c * T(p[k] * T(dp[k] - mean)));
    }
}

}  // namespace tapegrad::fused_detail
