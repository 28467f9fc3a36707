/// \file
/// mean: averages the elements along one axis, Y = (1/n)·Σ_j X[..., j, ...] (a per-row or
/// per-feature average, e.g. a mean over a sequence).
///   X [d0, ..., d(r−1)], rank 1..4, axis a in [−r, r), n = d_a -> Y with d_a removed (a rank-1 X
///   gives a scalar) or kept as 1 (keepdims); lanes and shapes as in ops/axis.hpp.
/// Y[o, i] = (Σ_j X[o, j, i]) / n: the lane's total divided by n in T's own precision (one
/// correctly rounded division, so a 50-digit tape keeps its 50 digits).
/// VJP: dX[o, j, i] = G[o, i] / n.
///   ∂Y[o, i]/∂X[o', j, i'] = δ_oo'·δ_ii'/n for every j (each element enters the average with
///   weight 1/n), so dX[o', j, i'] = Σ_{o,i} G[o, i]·δ_oo'·δ_ii'/n = G[o', i']/n: sum_axis's
///   broadcast of G, divided by n.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "ops/axis.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Mean {
    static constexpr std::string_view name = "mean";
    static constexpr Arity arity{1};

    using Settings = reduction::Settings;
    static constexpr auto fields(auto& s) { return reduction::fields(s); }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return mean(in[0], reduction::axis_argument(s.axis), s.keepdims);
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& X = *in[0];
        const axes::View lanes = axes::around(X.shape(), s.axis);
        const T n(lanes.dim);
        out.resize(reduction::reduced_shape(X.shape(), s));
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            T total(0);
            for (std::size_t j = 0; j < lanes.dim; ++j) total += X[first + j * lanes.stride()];
            out[lane] = total / n;
        }
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const axes::View lanes = axes::around(dX.shape(), s.axis);
        const T n(lanes.dim);
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            const T share = at.G[lane] / n;
            for (std::size_t j = 0; j < lanes.dim; ++j) dX[first + j * lanes.stride()] = share;
        }
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        return {in[0]->size(), in[0]->size()};
    }
};

/// The average along `axis` (in [−rank, rank)); keepdims keeps the axis as a dimension of size 1.
template <Scalar T>
Var<T> mean(const Var<T>& X, int axis, bool keepdims = false) {
    const reduction::Settings s = reduction::checked(Mean::name, X, axis, keepdims);
    return X.tape().template record<Mean>({X}, s);
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> mean<T>(const Var<T>&, int, bool);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
