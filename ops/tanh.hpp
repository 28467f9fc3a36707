// tanh: the hyperbolic tangent, elementwise, Y = tanh(A) (a bounded nonlinearity, values in (−1, 1)).
//   A [...] -> Y [...]
// VJP: dA = G ∘ (1 − Y²), since d tanh(a)/da = 1/cosh²(a) = 1 − tanh²(a): the saved output is all
// it needs. tanh saturates to exactly ±1 in double for |a| > 19 (derivative 0 there), never NaN;
// tanh(±inf) = ±1.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Tanh {
    static constexpr std::string_view name = "tanh";

    using Settings = NoSettings;

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        using std::tanh;
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = tanh(A[k]);
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& Y = at.out;
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * (1 - Y[k] * Y[k]);
    }
};

template <Scalar T>
Var<T> tanh(const Var<T>& A) {
    checks::non_empty(Tanh::name, "A", A);
    return A.tape().template record<Tanh>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> tanh<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
