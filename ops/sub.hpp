/// \file
/// sub: elementwise difference with NumPy broadcasting, C = A − B (a residual; a mean subtracted
/// from every row).
///   A, B of shapes that broadcast (ops/broadcast.hpp) -> C of the broadcast shape.
/// VJP: dA = G, dB = −G, each summed over the axes along which that input was stretched.
///   C_k = A_ia − B_ib, so ∂C_k/∂A_ia = 1 and ∂C_k/∂B_ib = −1; an input element read by several
///   output elements receives the sum of their contributions: ∂J/∂B_i = −Σ_{k → i} G_k.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/broadcast.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Sub {
    static constexpr std::string_view name = "sub";
    static constexpr Arity arity{2};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return sub(in[0], in[1]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        broadcast_apply(*in[0], *in[1], out, [](const T& a, const T& b) { return T(a - b); });
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        sum_to_shape(at.G, grad);
        if (which == 1) {
            for (T& x : grad.data()) x = -x;
        }
    }
};

template <Scalar T>
Var<T> sub(const Var<T>& A, const Var<T>& B) {
    broadcastable(Sub::name, A, B);
    return A.tape().template record<Sub>({A, B});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> sub<T>(const Var<T>&, const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
