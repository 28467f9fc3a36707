/// \file
/// add: elementwise sum with NumPy broadcasting, C = A + B (token + position embeddings; a bias
/// row [1, n] added to every row of a matrix [m, n]).
///   A, B of shapes that broadcast (ops/broadcast.hpp) -> C of the broadcast shape.
/// VJP: dA = G summed over the axes along which A was stretched, likewise dB.
///   Each C_k = A_ia + B_ib depends on one element of each input with slope 1, so
///   ∂J/∂A_i = Σ_{k → i} G_k: G itself when A has C's shape, summed over the copies otherwise.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/broadcast.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Add {
    static constexpr std::string_view name = "add";
    static constexpr Arity arity{2};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return add(in[0], in[1]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        broadcast_apply(*in[0], *in[1], out, [](const T& a, const T& b) { return T(a + b); });
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        sum_to_shape(at.G, grad);
    }
};

template <Scalar T>
Var<T> add(const Var<T>& A, const Var<T>& B) {
    broadcastable(Add::name, A, B);
    return A.tape().template record<Add>({A, B});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> add<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
