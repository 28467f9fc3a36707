/// \file
/// max: the largest element along one axis, Y = max_j X[..., j, ...] (max pooling over a sequence,
/// the largest score of a row).
///   X [d0, ..., d(r−1)], rank 1..4, axis a in [−r, r) -> Y with d_a removed (a rank-1 X gives a
///   scalar) or kept as 1 (keepdims); lanes and shapes as in ops/axis.hpp. −inf elements are
///   ordinary values (a lane of −inf only has the maximum −inf).
/// VJP: dX[o, j, i] = G[o, i] at j = j*(o, i), the FIRST index along the axis where X equals the
/// maximum; 0 everywhere else.
///   Where the maximum is attained at one j only, it stays there under a small enough change of X,
///   so locally Y[o, i] = X[o, j*, i]: ∂Y[o, i]/∂X[o, j, i] = δ_jj*, and dX = G routed to the argmax.
/// Ties: where several elements share the maximum, max has a kink (its one-sided derivatives
/// differ: moving one tied element up moves Y, moving it down does not), and no gradient is the
/// derivative. The convention here, the index NumPy's argmax picks: the first tied element gets
/// all of G, the other tied elements get zero. A central difference at a two-way tie sees half of
/// G on each tied element (one side G, the other 0), so the gradient checker reports such
/// coordinates as kinks rather than agreeing; tests/test_reductions.cpp pins the convention on a
/// hand-made tensor with ties.
/// The VJP finds j* again from the input and the recorded output (Y is a copy of X[o, j*, i], so
/// equality is exact): nothing is saved.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "ops/axis.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Max {
    static constexpr std::string_view name = "max";
    static constexpr Arity arity{1};

    using Settings = reduction::Settings;
    static constexpr auto fields(auto& s) { return reduction::fields(s); }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return max(in[0], reduction::axis_argument(s.axis), s.keepdims);
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& X = *in[0];
        const axes::View lanes = axes::around(X.shape(), s.axis);
        out.resize(reduction::reduced_shape(X.shape(), s));
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            T largest = X[first];
            for (std::size_t j = 1; j < lanes.dim; ++j) {
                const T& x = X[first + j * lanes.stride()];
                if (x > largest) largest = x;  // strict: a later tie never replaces the first
            }
            out[lane] = largest;
        }
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const Tensor<T>& X = *at.in[0];
        const axes::View lanes = axes::around(X.shape(), s.axis);
        dX.fill(T(0));
        for (std::size_t lane = 0; lane < lanes.lanes(); ++lane) {
            const std::size_t first = lanes.first(lane);
            std::size_t j = 0;  // the first maximal element (found before the last; bounded all the same)
            while (j + 1 < lanes.dim && X[first + j * lanes.stride()] != at.out[lane]) ++j;
            dX[first + j * lanes.stride()] = at.G[lane];
        }
    }

    /// The branch output element (lane) k took (autodiff/op.hpp): the index along the axis of the
    /// first maximal element, the one the VJP routes G to.
    template <Scalar T>
    static std::uint32_t branch(const Settings& s, Inputs<T> in, std::size_t k) {
        const Tensor<T>& X = *in[0];
        const axes::View lanes = axes::around(X.shape(), s.axis);
        const std::size_t first = lanes.first(k);
        std::size_t argmax = 0;
        for (std::size_t j = 1; j < lanes.dim; ++j) {
            if (X[first + j * lanes.stride()] > X[first + argmax * lanes.stride()]) argmax = j;
        }
        return static_cast<std::uint32_t>(argmax);
    }
};

/// The largest element along `axis` (in [−rank, rank)); keepdims keeps the axis as a dimension of
/// size 1. Its gradient goes to the first maximal element of each lane (see above for ties).
template <Scalar T>
Var<T> max(const Var<T>& X, int axis, bool keepdims = false) {
    const reduction::Settings s = reduction::checked(Max::name, X, axis, keepdims);
    return X.tape().template record<Max>({X}, s);
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> max<T>(const Var<T>&, int, bool);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
