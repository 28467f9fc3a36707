/// \file
/// mul: elementwise (Hadamard) product with NumPy broadcasting, C = A ∘ B (the spec's probe O ∘ G;
/// dropout's mask; a per-column gain [1, n] applied to a matrix [m, n]).
///   A, B of shapes that broadcast (ops/broadcast.hpp) -> C of the broadcast shape.
/// VJP: dA = G ∘ B, dB = G ∘ A, each summed over the axes along which that input was stretched.
///   C_k = A_ia·B_ib, so ∂C_k/∂A_ia = B_ib and ∂C_k/∂B_ib = A_ia; an input element read by several
///   output elements receives the sum: ∂J/∂A_i = Σ_{k → i} G_k·B_ib.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/broadcast.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Mul {
    static constexpr std::string_view name = "mul";
    static constexpr Arity arity{2};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return mul(in[0], in[1]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        broadcast_apply(*in[0], *in[1], out, [](const T& a, const T& b) { return T(a * b); });
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        if (which == 0) {
            broadcast_vjp(at, 0, grad, [](const T& g, const T&, const T& b) { return T(g * b); });
        } else {
            broadcast_vjp(at, 1, grad, [](const T& g, const T& a, const T&) { return T(g * a); });
        }
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        const std::size_t n = try_broadcast_shape(in[0]->shape(), in[1]->shape())->size();
        return {n, 2 * n};
    }
};

template <Scalar T>
Var<T> mul(const Var<T>& A, const Var<T>& B) {
    broadcastable(Mul::name, A, B);
    return A.tape().template record<Mul>({A, B});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> mul<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
