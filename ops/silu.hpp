/// \file
/// silu: the sigmoid-weighted linear unit (swish), elementwise, Y = A ∘ σ(A): the gate of LLaMA's
/// and Mistral's SwiGLU MLP, W_down·(silu(X·W_gate) ∘ (X·W_up)), as torch.nn.functional.silu.
///   A [...] -> Y [...]
/// VJP: dA = G ∘ (σ(a) + a·σ'(a)),  σ'(a) = e^(−|a|) / (1 + e^(−|a|))²  (Sigmoid::slope).
///   Forgetting the a·σ'(a) term (the slope of the gate itself) gives G ∘ σ(A), wrong everywhere
///   but at a = 0.
/// SwiGLU is composed, mul(silu(gate), up), rather than an op of its own: its VJP is the product
/// rule of mul over silu's, both proven here, so a fused op would add a derivation and no accuracy
/// (a decoder composes it so).
/// Stable for any |a|: σ takes e^(−|a|) only (Sigmoid::logistic); silu(−1e4) is −0·… = −0 in
/// double, with derivative 0, never NaN.
#pragma once

#include "autodiff/instances.hpp"
#include "autodiff/cpu.hpp"
#include "autodiff/tape.hpp"
#include "ops/checks.hpp"
#include "ops/fast/kernels.hpp"
#include "ops/sigmoid.hpp"

namespace tapegrad {

struct Silu {
    static constexpr std::string_view name = "silu";
    static constexpr Arity arity{1};

    using Settings = NoSettings;
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return silu(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        if constexpr (has_compiled_kernels<T>) {  // the same expression, vectorised (src/cpu/level_kernels.hpp)
            return op_kernels<T>().silu(A.data().data(), A.size(), Y.data().data());
        }
        for (std::size_t k = 0; k < A.size(); ++k) Y[k] = A[k] * Sigmoid::logistic(A[k]);
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        if constexpr (has_compiled_kernels<T>) {
            return op_kernels<T>().silu_vjp(A.data().data(), at.G.data().data(), A.size(), dA.data().data());
        }
        for (std::size_t k = 0; k < at.G.size(); ++k)
            dA[k] = at.G[k] * T(Sigmoid::logistic(A[k]) + A[k] * Sigmoid::slope(A[k]));
    }
};

template <Scalar T>
Var<T> silu(const Var<T>& A) {
    checks::non_empty(Silu::name, "A", A);
    return A.tape().template record<Silu>({A});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> silu<T>(const Var<T>&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
