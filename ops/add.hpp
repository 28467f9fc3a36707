// add: elementwise sum of two tensors of the same shape, C = A + B (token + position embeddings).
// VJP: dA = G, dB = G  (each output coordinate depends on one coordinate of each input, slope 1).
#pragma once

#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Add {
    static constexpr std::string_view name = "add";

    using Settings = NoSettings;

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& a = *in[0];
        const Tensor<T>& b = *in[1];
        out.resize(a.shape());
        for (std::size_t k = 0; k < a.size(); ++k) out[k] = a[k] + b[k];
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        std::copy(at.G.data().begin(), at.G.data().end(), grad.data().begin());
    }
};

template <Scalar T>
Var<T> add(const Var<T>& A, const Var<T>& B) {
    checks::same_shape(Add::name, A, B);
    return A.tape().template record<Add>({A, B});
}

}  // namespace tapegrad
