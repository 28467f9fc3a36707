/// \file
/// reciprocal: elementwise 1/x, Y = 1 / X (c / a in ops/operators.hpp is scale(reciprocal(a), c)).
///   X [any shape] -> Y [same shape]. A 0 anywhere in X is refused (value_error naming the index).
/// VJP: dX = −G ∘ Y²  (d(x⁻¹)/dx = −x⁻² = −(1/x)², read from the saved output Y).
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Reciprocal {
    static constexpr std::string_view name = "reciprocal";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return reciprocal(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& x = *in[0];
        out.resize(x.shape());
        for (std::size_t k = 0; k < x.size(); ++k) out[k] = T(1) / x[k];
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        for (std::size_t k = 0; k < at.G.size(); ++k) grad[k] = -at.G[k] * at.out[k] * at.out[k];
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        return {in[0]->size(), 2 * in[0]->size()};
    }
};

template <Scalar T>
Var<T> reciprocal(const Var<T>& X) {
    checks::non_empty(Reciprocal::name, "X", X);
    checks::no_zero_divisor(Reciprocal::name, "X", X);
    return X.tape().template record<Reciprocal>({X});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> reciprocal<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
