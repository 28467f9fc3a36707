/// \file
/// abs: the absolute value, elementwise, Y = |A| (L1 penalties, magnitudes).
///   A [...] -> Y [...]
/// VJP: dA = G ∘ sign(A), since d|a|/da = +1 for a > 0 and −1 for a < 0.
/// At a = 0 there is a kink: |a| has no derivative there, and the VJP gives 0 (sign(0) = 0, the
/// middle of the subgradients [−1, 1], as PyTorch and JAX do; it is also what the central difference
/// (|h| − |−h|) / 2h gives). The gradient checker reports a coordinate at 0 as a kink, not as
/// a verified derivative; check this op on inputs away from 0.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Abs {
    static constexpr std::string_view name = "abs";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return abs(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = magnitude(A[k]);
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < at.G.size(); ++k) {
            dA[k] = A[k] > T(0) ? at.G[k] : A[k] < T(0) ? T(-at.G[k]) : T(0);
        }
    }

    /// The branch element k took: A below, at or above 0 (autodiff/op.hpp).
    template <Scalar T>
    static std::uint32_t branch(const Settings&, Inputs<T> in, std::size_t k) {
        return sign_class((*in[0])[k]);
    }
};

template <Scalar T>
Var<T> abs(const Var<T>& A) {
    checks::non_empty(Abs::name, "A", A);
    return A.tape().template record<Abs>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> abs<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
