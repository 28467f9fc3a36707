/// \file
/// div: elementwise quotient with NumPy broadcasting, C = A / B (a normalisation by a per-row
/// total [m, 1]; a ratio of two tensors).
///   A, B of shapes that broadcast (ops/broadcast.hpp) -> C of the broadcast shape.
///   A 0 anywhere in B is refused (value_error naming the index): the quotient would be ±inf or NaN.
/// VJP, each summed over the axes along which that input was stretched:
///   dA = G / B          C_k = A_ia / B_ib, so ∂C_k/∂A_ia = 1 / B_ib;
///   dB = −G ∘ A / B²    ∂C_k/∂B_ib = −A_ia / B_ib² (the derivative of b⁻¹ is −b⁻²).
///   An input element read by several output elements receives the sum of their contributions.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/broadcast.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Div {
    static constexpr std::string_view name = "div";
    static constexpr Arity arity{2};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return div(in[0], in[1]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        broadcast_apply(*in[0], *in[1], out, [](const T& a, const T& b) { return T(a / b); });
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        if (which == 0) {
            broadcast_vjp(at, 0, grad, [](const T& g, const T&, const T& b) { return T(g / b); });
        } else {
            broadcast_vjp(at, 1, grad, [](const T& g, const T& a, const T& b) { return T(-g * a / (b * b)); });
        }
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        const std::size_t n = try_broadcast_shape(in[0]->shape(), in[1]->shape())->size();
        return {n, 3 * n};
    }
};

template <Scalar T>
Var<T> div(const Var<T>& A, const Var<T>& B) {
    broadcastable(Div::name, A, B);
    checks::no_zero_divisor(Div::name, "the divisor B", B);
    return A.tape().template record<Div>({A, B});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> div<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
