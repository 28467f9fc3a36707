// mul: elementwise (Hadamard) product of two tensors of the same shape, C = A ∘ B
// (the spec's probe O ∘ G; dropout's mask).
// VJP: dA = G ∘ B, dB = G ∘ A  (∂C_k/∂A_k = B_k, ∂C_k/∂B_k = A_k).
#pragma once

#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Mul {
    static constexpr std::string_view name = "mul";

    using Settings = NoSettings;

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& a = *in[0];
        const Tensor<T>& b = *in[1];
        out.resize(a.shape());
        for (std::size_t k = 0; k < a.size(); ++k) out[k] = a[k] * b[k];
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& grad) {
        const Tensor<T>& other = *at.in[1 - which];
        for (std::size_t k = 0; k < at.G.size(); ++k) grad[k] = at.G[k] * other[k];
    }

    template <Scalar T>
    static OpCost cost(const Settings&, Inputs<T> in) {
        return {in[0]->size(), 2 * in[0]->size()};
    }
};

template <Scalar T>
Var<T> mul(const Var<T>& A, const Var<T>& B) {
    checks::same_shape(Mul::name, A, B);
    return A.tape().template record<Mul>({A, B});
}

}  // namespace tapegrad
