/// \file
/// sum: adds every element into a scalar, J = Σ_k X_k (with mul, the probe J = Σ O ∘ G).
/// VJP: dX = G·1  (G is the scalar upstream gradient; every ∂J/∂X_k = 1).
/// sum(X, axis, keepdims) adds along one axis only: the op sum_axis, in ops/sum_axis.hpp, included
/// here so that both overloads of sum come with this header.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "ops/sum_axis.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Sum {
    static constexpr std::string_view name = "sum";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return sum(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        T total(0);
        for (const T& x : in[0]->data()) total += x;
        out.resize(Shape{});
        out[0] = total;
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        grad.fill(at.G[0]);
    }
};

template <Scalar T>
Var<T> sum(const Var<T>& X) {
    checks::non_empty(Sum::name, "X", X);
    return X.tape().template record<Sum>({X});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> sum<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
