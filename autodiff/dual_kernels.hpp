/// \file
/// Products of dual matrices as real products: for A = Av + At·ε and B = Bv + Bt·ε,
///   A·B = Av·Bv + (At·Bv + Av·Bt)·ε,
/// so C's value plane is one real GEMM and its tangent plane two, each through the real kernel of
/// autodiff/kernels.hpp (Eigen for double, the plain loop for 50 digits), never an element loop
/// over dual numbers. A tangent plane that is all zero (a constant operand: a probe G, a mask, the
/// seed of a backward) is skipped, so a product with a constant costs two GEMMs, not three. For the
/// scalars without compiled kernels (50 digits, intervals) a tangent plane's zero entries are
/// skipped too (Dual's strong zero: a zero tangent contributes exactly nothing), since there a
/// forward pass usually moves one leaf element, and its tangents stay sparse for several ops.
/// Include this file, not kernels.hpp, where kernels::gemm is called on a template's scalar: the
/// call then picks this overload for Dual pointers (ops/matmul.hpp, ops/fused_attention.hpp).
#pragma once

#include "autodiff/cpu.hpp"
#include "autodiff/dual.hpp"
#include "autodiff/kernels.hpp"  // Form and the real gemm
#include "autodiff/scalar.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tapegrad::kernels {

namespace dual_detail {

/// The value and tangent planes of n dual numbers. Returns whether any tangent is nonzero: looked
/// for after the copy, which then vectorises for double (a test inside it did not, and was 15% of an
/// HVP at T = 64), and which stops at the first nonzero tangent (the first one, for a leaf or
/// anything computed from one).
template <Scalar T>
bool split(const Dual<T>* x, std::size_t n, std::vector<T>& values, std::vector<T>& tangents) {
    values.resize(n);
    tangents.resize(n);
    if constexpr (has_compiled_kernels<T>) {
        // The compiled kernel splits the pairs at the CPU's level (the element loop, compiled at the
        // baseline's, was 8.5% of a T = 64 HVP).
        engine_kernels<T>().deinterleave(pairs_of(x), n, values.data(), tangents.data());
    } else {
        for (std::size_t k = 0; k < n; ++k) {
            values[k] = x[k].value();
            tangents[k] = x[k].tangent();
        }
    }
    return std::any_of(tangents.begin(), tangents.end(), [](const T& t) { return !exactly_zero(t); });  // as Dual's strong zero
}

/// C[x] = (values[x], tangents[x]), or C[x] += that when accumulate.
template <Scalar T>
void merge(const std::vector<T>& values, const std::vector<T>& tangents, Dual<T>* C, bool accumulate) {
    const std::size_t n = values.size();
    if constexpr (has_compiled_kernels<T>) {
        engine_kernels<T>().interleave(values.data(), tangents.data(), n, pairs_of(C), accumulate);
    } else if (accumulate) {
        for (std::size_t x = 0; x < n; ++x) C[x] += Dual<T>(values[x], tangents[x]);
    } else {
        for (std::size_t x = 0; x < n; ++x) C[x] = Dual<T>(values[x], tangents[x]);
    }
}

/// C += op(A)·op(B) over the nonzero entries of the tangent plane A (a_sparse) or B only; shapes as
/// for the real gemm. Exact zeros of the plane are Dual's strong zeros, which contribute nothing.
template <Scalar T>
void gemm_skipping_zeros(Form form, std::size_t m, std::size_t n, std::size_t k, const T* A, const T* B, T* C,
                         bool a_sparse) {
    // Entry (row r, column c) of op(A) (m×k) and of op(B) (k×n).
    const auto a_at = [&](std::size_t r, std::size_t c) -> const T& {
        return form == Form::aTb ? A[c * m + r] : A[r * k + c];
    };
    const auto b_at = [&](std::size_t r, std::size_t c) -> const T& {
        return form == Form::abT ? B[c * k + r] : B[r * n + c];
    };
    for (std::size_t i = 0; i < (a_sparse ? m : k); ++i) {
        for (std::size_t p = 0; p < (a_sparse ? k : n); ++p) {
            if (a_sparse) {  // op(A)[i,p] moves row i of C by it times row p of op(B)
                const T& a = a_at(i, p);
                if (exactly_zero(a)) continue;
                for (std::size_t j = 0; j < n; ++j) kernels::multiply_add(C[i * n + j], a, b_at(p, j));
            } else {  // op(B)[i,p] moves column p of C by column i of op(A) times it
                const T& b = b_at(i, p);
                if (exactly_zero(b)) continue;
                for (std::size_t r = 0; r < m; ++r) kernels::multiply_add(C[r * n + p], a_at(r, i), b);
            }
        }
    }
}

/// Scratch planes, one set per thread (fused attention calls products from several threads), kept
/// between calls so a product allocates nothing once warm.
template <Scalar T>
struct Planes {
    std::vector<T> Av, At, Bv, Bt, Cv, Ct;
};

}  // namespace dual_detail

/// C (m×n) = op(A)·op(B) or C += op(A)·op(B) for dual matrices; shapes as for the real gemm.
template <Scalar T>
void gemm(Form form, std::size_t m, std::size_t n, std::size_t k, const Dual<T>* A, const Dual<T>* B, Dual<T>* C,
          bool accumulate) {
    thread_local dual_detail::Planes<T> p;
    const bool a_moves = dual_detail::split(A, m * k, p.Av, p.At);
    const bool b_moves = dual_detail::split(B, k * n, p.Bv, p.Bt);
    p.Cv.resize(m * n);
    p.Ct.resize(m * n);
    gemm(form, m, n, k, p.Av.data(), p.Bv.data(), p.Cv.data(), false);
    if constexpr (has_compiled_kernels<T>) {
        if (a_moves) gemm(form, m, n, k, p.At.data(), p.Bv.data(), p.Ct.data(), false);
        if (b_moves) gemm(form, m, n, k, p.Av.data(), p.Bt.data(), p.Ct.data(), a_moves);
        if (!a_moves && !b_moves) std::fill(p.Ct.begin(), p.Ct.end(), T(0));
    } else {
        std::fill(p.Ct.begin(), p.Ct.end(), T(0));
        if (a_moves) dual_detail::gemm_skipping_zeros(form, m, n, k, p.At.data(), p.Bv.data(), p.Ct.data(), true);
        if (b_moves) dual_detail::gemm_skipping_zeros(form, m, n, k, p.Av.data(), p.Bt.data(), p.Ct.data(), false);
    }
    dual_detail::merge(p.Cv, p.Ct, C, accumulate);
}

}  // namespace tapegrad::kernels
