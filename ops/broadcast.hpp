/// \file
/// NumPy broadcasting for the elementwise binary ops (add, sub, mul, div): which shapes combine,
/// which input element feeds each output element, and how an upstream gradient goes back to an
/// input that was stretched.
///
/// Shapes are aligned from the last dimension. On each aligned axis the two dimensions must be
/// equal, or one of them 1 (that operand is stretched along the axis); an axis an operand lacks
/// (a missing leading dimension) counts as 1. The result has the larger rank (≤ 4, as Tensor):
///   [2x3] with [1x3] -> [2x3];  [3x1] with [1x4] -> [3x4];  [] with [2x2x2x2] -> [2x2x2x2];
///   [4] with [2x3x4] -> [2x3x4];  [2x3] with [3x4]: shape_error.
/// Index mapping: output element k at multi-index (i0, i1, i2, i3) reads operand element
/// (i0·s0 + i1·s1 + i2·s2 + i3·s3) where s are the operand's row-major strides with 0 on every
/// stretched or missing axis (so the index there is ignored).
/// Gradient reduction: an input element x_i feeds every output element k that maps to i, so
///   dJ/dx_i = Σ_{k → i} G_k · ∂Y_k/∂x_i,
/// the elementwise VJP summed over the stretched dimensions (for add, dA = G summed to A's shape).
#pragma once

#include "ops/checks.hpp"
#include "autodiff/op.hpp"
#include "autodiff/tensor.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace tapegrad {

/// a == b, compared dimension by dimension inline: the same-shape test on every call of an
/// elementwise op, where Shape's operator== (a call to memcmp) was a measurable part of an op's cost.
inline bool same_dims(const Shape& a, const Shape& b) {
    if (a.rank() != b.rank()) return false;
    for (std::size_t axis = 0; axis < a.rank(); ++axis) {
        if (a[axis] != b[axis]) return false;
    }
    return true;
}

/// The broadcast shape of a and b, or nothing when they do not broadcast.
inline std::optional<Shape> try_broadcast_shape(const Shape& a, const Shape& b) {
    const std::size_t rank = std::max(a.rank(), b.rank());
    std::array<std::size_t, max_rank> dims{};
    for (std::size_t axis = 0; axis < rank; ++axis) {  // axis counted from the last dimension
        const std::size_t da = axis < a.rank() ? a[a.rank() - 1 - axis] : 1;
        const std::size_t db = axis < b.rank() ? b[b.rank() - 1 - axis] : 1;
        if (da != db && da != 1 && db != 1) return std::nullopt;
        dims[rank - 1 - axis] = da == 1 ? db : da;
    }
    return Shape(std::span<const std::size_t>(dims.data(), rank));
}

/// The broadcast shape of a and b; shape_error naming `op`, both shapes and the first axis (from
/// the last) whose dimensions clash.
inline Shape broadcast_shape(std::string_view op, const Shape& a, const Shape& b) {
    if (const std::optional<Shape> shape = try_broadcast_shape(a, b)) return *shape;
    std::size_t axis = 0;
    while (a[a.rank() - 1 - axis] == b[b.rank() - 1 - axis] || a[a.rank() - 1 - axis] == 1 ||
           b[b.rank() - 1 - axis] == 1) {
        ++axis;  // a clash exists within min(rank) axes, so this stops there
    }
    throw shape_error(fmt::format(
        "{}: shapes differ and do not broadcast: {} and {} (aligned from the last dimension, dimension {} of the "
        "first and {} of the second differ and neither is 1)",
        op, a.to_string(), b.to_string(), a[a.rank() - 1 - axis], b[b.rank() - 1 - axis]));
}

/// The public functions' check for two operands: both non-empty, shapes broadcast.
template <Scalar T>
void broadcastable(std::string_view op, const Var<T>& a, const Var<T>& b) {
    checks::non_empty(op, "the first argument", a);
    if (same_dims(a.shape(), b.shape())) return;  // the common case, as cheap as before broadcasting
    checks::non_empty(op, "the second argument", b);
    (void)broadcast_shape(op, a.shape(), b.shape());
}

/// How the elements of two operands line up with the elements of their broadcast result `out`
/// (the operands' shapes must broadcast to `out`).
class BroadcastLayout {
public:
    BroadcastLayout(const Shape& out, const Shape& a, const Shape& b) {
        const std::size_t pad = max_rank - out.rank();
        for (std::size_t axis = 0; axis < max_rank; ++axis) dims_[axis] = axis < pad ? 1 : out[axis - pad];
        strides_[0] = strides_of(a);
        strides_[1] = strides_of(b);
    }

    /// The flat index of the element of operand `which` (0 = a, 1 = b) that output element k reads.
    std::size_t source(std::size_t which, std::size_t k) const {
        std::size_t flat = 0;
        for (std::size_t axis = max_rank; axis-- > 0;) {
            flat += (k % dims_[axis]) * strides_[which][axis];
            k /= dims_[axis];
        }
        return flat;
    }

    /// Calls f(k, ia, ib) for every output element k in increasing order, with the flat indices of
    /// the elements of a and b it reads. The operand offsets advance by strides, not by division.
    template <class F>
    void for_each(F&& f) const {
        const auto& [sa, sb] = strides_;
        std::size_t k = 0;
        for (std::size_t i0 = 0; i0 < dims_[0]; ++i0) {
            for (std::size_t i1 = 0; i1 < dims_[1]; ++i1) {
                for (std::size_t i2 = 0; i2 < dims_[2]; ++i2) {
                    const std::size_t ia = i0 * sa[0] + i1 * sa[1] + i2 * sa[2];
                    const std::size_t ib = i0 * sb[0] + i1 * sb[1] + i2 * sb[2];
                    for (std::size_t i3 = 0; i3 < dims_[3]; ++i3) f(k++, ia + i3 * sa[3], ib + i3 * sb[3]);
                }
            }
        }
    }

private:
    using Strides = std::array<std::size_t, max_rank>;

    /// Row-major strides of `operand` aligned to the padded result axes; 0 where it is stretched
    /// (dimension 1 against a larger one) or has no axis.
    Strides strides_of(const Shape& operand) const {
        Strides strides{};
        const std::size_t pad = max_rank - operand.rank();
        std::size_t stride = 1;
        for (std::size_t axis = max_rank; axis-- > pad;) {
            const std::size_t dim = operand[axis - pad];
            strides[axis] = dim == 1 && dims_[axis] != 1 ? 0 : stride;
            stride *= dim;
        }
        return strides;
    }

    std::array<std::size_t, max_rank> dims_{};
    std::array<Strides, 2> strides_{};
};

// The elementwise kernels below each have a fast path for the common case (operands of one
// shape: no index arithmetic, small enough to inline into the op) and call a separate function for
// stretched operands, which walks a BroadcastLayout.

/// Y_k = f(A_ia, B_ib), for operands of different shapes.
template <Scalar T, class F>
void broadcast_apply_stretched(const Tensor<T>& a, const Tensor<T>& b, Tensor<T>& out, F f) {
    out.resize(*try_broadcast_shape(a.shape(), b.shape()));
    BroadcastLayout(out.shape(), a.shape(), b.shape()).for_each([&](std::size_t k, std::size_t ia, std::size_t ib) {
        out[k] = f(a[ia], b[ib]);
    });
}

/// Y_k = f(A_ia, B_ib) over the broadcast shape of a and b.
template <Scalar T, class F>
void broadcast_apply(const Tensor<T>& a, const Tensor<T>& b, Tensor<T>& out, F f) {
    if (!same_dims(a.shape(), b.shape())) return broadcast_apply_stretched(a, b, out, f);
    out.resize(a.shape());
    for (std::size_t k = 0; k < a.size(); ++k) out[k] = f(a[k], b[k]);
}

/// broadcast_vjp for operands of different shapes: zero, then add each output element's share.
template <Scalar T, class Partial>
void broadcast_vjp_stretched(const VjpArgs<T>& at, std::size_t which, Tensor<T>& din, Partial partial) {
    const Tensor<T>& a = *at.in[0];
    const Tensor<T>& b = *at.in[1];
    din.fill(T(0));
    BroadcastLayout(at.G.shape(), a.shape(), b.shape()).for_each([&](std::size_t k, std::size_t ia, std::size_t ib) {
        din[which == 0 ? ia : ib] += partial(at.G[k], a[ia], b[ib]);
    });
}

/// The VJP of input `which` of Y = f(A, B): din_i = Σ_{k → i} partial(G_k, A_ia, B_ib), where
/// partial(g, a, b) = g·∂f/∂(input which) at (a, b): the elementwise VJP, summed over the axes
/// along which that input was stretched.
template <Scalar T, class Partial>
void broadcast_vjp(const VjpArgs<T>& at, std::size_t which, Tensor<T>& din, Partial partial) {
    const Tensor<T>& a = *at.in[0];
    const Tensor<T>& b = *at.in[1];
    if (!same_dims(a.shape(), b.shape())) return broadcast_vjp_stretched(at, which, din, partial);
    for (std::size_t k = 0; k < at.G.size(); ++k) din[k] = partial(at.G[k], a[k], b[k]);
}

/// sum_to_shape for a din stretched along some axes of G.
template <Scalar T>
void sum_to_shape_stretched(const Tensor<T>& G, Tensor<T>& din) {
    din.fill(T(0));
    BroadcastLayout(G.shape(), din.shape(), din.shape()).for_each([&](std::size_t k, std::size_t i, std::size_t) {
        din[i] += G[k];
    });
}

/// G (the output's shape) summed over every axis along which `din`'s shape was stretched, into
/// din: the VJP of an input that enters the output with slope 1 (add's dA, dB).
template <Scalar T>
void sum_to_shape(const Tensor<T>& G, Tensor<T>& din) {
    if (!same_dims(G.shape(), din.shape())) return sum_to_shape_stretched(G, din);
    std::copy(G.data().begin(), G.data().end(), din.data().begin());
}

}  // namespace tapegrad
