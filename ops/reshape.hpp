/// \file
/// reshape: gives a tensor a new shape with the same number of elements, reading it in row-major
/// order (flatten a batch of matrices into one, or split a flat vector into [B, T, D]).
///   X [d_0, ..., d_{r-1}] -> Y [e_0, ..., e_{s-1}]   with Π d = Π e   (ranks 0..4; Settings{shape})
///   Y_k = X_k for every flat (row-major) position k: the data is unchanged, only its shape is.
/// VJP: dX = G read with X's shape. Each Y_k is the one coordinate X_k, so ∂Y_k/∂X_l = δ_kl and
/// dX_l = Σ_k G_k δ_kl = G_l at the same flat position: G reshaped back.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <algorithm>

namespace tapegrad {

struct Reshape {
    static constexpr std::string_view name = "reshape";
    static constexpr Arity arity{1};

    /// The shape of the output (the input's shape is known from the input itself).
    struct Settings {
        Shape shape;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("shape", s.shape)}; }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return reshape(in[0], s.shape);
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& x = *in[0];
        out.resize(s.shape);
        std::copy(x.data().begin(), x.data().end(), out.data().begin());
    }

    /// `dX` is already shaped like X: the flat copy is the reshape back.
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        std::copy(at.G.data().begin(), at.G.data().end(), dX.data().begin());
    }
};

/// X with shape `shape`, which must hold as many elements as X.
template <Scalar T>
Var<T> reshape(const Var<T>& X, const Shape& shape) {
    checks::non_empty(Reshape::name, "X", X);
    const Shape& x = X.shape();
    if (shape.size() != x.size()) {
        throw shape_error(fmt::format("reshape: cannot reshape X of shape {} ({} elements) into {} ({} elements)",
                                      x.to_string(), x.size(), shape.to_string(), shape.size()));
    }
    return X.tape().template record<Reshape>({X}, Reshape::Settings{shape});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> reshape<T>(const Var<T>&, const Shape&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
