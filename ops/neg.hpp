/// \file
/// neg: elementwise negation, Y = −X (the unary minus of ops/operators.hpp; c − a as shift(neg(a), c)).
///   X [any shape] -> Y [same shape].
/// VJP: dX = −G  (∂Y_k/∂X_k = −1, and each Y_k depends on X_k alone).
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Neg {
    static constexpr std::string_view name = "neg";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return neg(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& x = *in[0];
        out.resize(x.shape());
        for (std::size_t k = 0; k < x.size(); ++k) out[k] = -x[k];
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        for (std::size_t k = 0; k < at.G.size(); ++k) grad[k] = -at.G[k];
    }
};

template <Scalar T>
Var<T> neg(const Var<T>& X) {
    checks::non_empty(Neg::name, "X", X);
    return X.tape().template record<Neg>({X});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> neg<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
