/// \file
/// sum_axis: adds the elements along one axis, Y = Σ_j X[..., j, ...] (a per-row or per-column total;
/// sum(X, axis) calls it). The axis arithmetic every reduction along an axis shares is in ops/axis.hpp
/// (namespace reduction: the settings, the axis check, the reduced shape; axes::View: the lanes).
///   X [d0, ..., d(r−1)], rank r in 1..4, axis a in [−r, r) (negative counts from the end, as NumPy)
///   -> Y with d_a removed (rank r − 1; a rank-1 X gives a rank-0 scalar), or kept as 1 (keepdims).
/// A row-major X is outer × n × inner around the axis (n = d_a, outer = d0⋯d(a−1),
/// inner = d(a+1)⋯d(r−1)); a lane is one (o, i) pair, the n elements X[o, j, i] that make one
/// output Y[o, i] (flat o·inner + i, with or without the kept 1).
/// VJP: dX[o, j, i] = G[o, i]: G broadcast back along the axis.
///   Y[o, i] = Σ_j X[o, j, i], so ∂Y[o, i]/∂X[o', j, i'] = δ_oo'·δ_ii' for every j, and
///   dX[o', j, i'] = Σ_{o,i} G[o, i]·∂Y[o, i]/∂X[o', j, i'] = G[o', i']. keepdims changes only
///   the shape of G (a 1 where the axis was), not its flat order.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/axis.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <array>
#include <cstddef>
#include <string_view>

namespace tapegrad {


struct SumAxis {
    static constexpr std::string_view name = "sum_axis";
    static constexpr Arity arity{1};

    using Settings = reduction::Settings;
    static constexpr auto fields(auto& s) { return reduction::fields(s); }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return sum(in[0], reduction::axis_argument(s.axis), s.keepdims);
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& X = *in[0];
        const axes::View lanes = axes::around(X.shape(), s.axis);
        out.resize(reduction::reduced_shape(X.shape(), s));
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            T total(0);
            for (std::size_t j = 0; j < lanes.dim; ++j) total += X[first + j * lanes.stride()];
            out[lane] = total;
        }
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const axes::View lanes = axes::around(dX.shape(), s.axis);
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            for (std::size_t j = 0; j < lanes.dim; ++j) dX[first + j * lanes.stride()] = at.G[lane];
        }
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        return {in[0]->size(), in[0]->size()};
    }
};

/// Σ along `axis` (in [−rank, rank)); keepdims keeps the axis as a dimension of size 1.
template <Scalar T>
Var<T> sum(const Var<T>& X, int axis, bool keepdims = false) {
    const reduction::Settings s = reduction::checked(SumAxis::name, X, axis, keepdims);
    return X.tape().template record<SumAxis>({X}, s);
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> sum<T>(const Var<T>&, int, bool);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
