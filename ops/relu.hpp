/// \file
/// relu: the rectified linear unit, elementwise, Y = max(A, 0).
///   A [...] -> Y [...]
/// VJP: dA = G ∘ [A > 0], since d max(a, 0)/da = 1 for a > 0 and 0 for a < 0.
/// At a = 0 there is a kink: the one-sided derivatives are 0 (left) and 1 (right). The VJP gives 0
/// there (PyTorch's and JAX's convention), a valid subgradient; the gradient checker reports such
/// a coordinate as AT A KINK (check/report.hpp, kink_threshold), neither a pass nor a failure.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Relu {
    static constexpr std::string_view name = "relu";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return relu(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = A[k] > T(0) ? A[k] : T(0);
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < A.size(); ++k) dA[k] = A[k] > T(0) ? at.G[k] : T(0);
    }

    /// The branch element k took: A below, at or above 0 (autodiff/op.hpp).
    template <Scalar T>
    static std::uint32_t branch(const Settings&, Inputs<T> in, std::size_t k) {
        return sign_class((*in[0])[k]);
    }
};

template <Scalar T>
Var<T> relu(const Var<T>& A) {
    checks::non_empty(Relu::name, "A", A);
    return A.tape().template record<Relu>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> relu<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
