// scale: multiplies by a constant, Y = c·X (the attention scale 1/√d; dropout's 1/(1-p)).
// VJP: dX = c·G  (∂Y_i/∂X_i = c).
#pragma once

#include "autodiff/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Scale {
    static constexpr std::string_view name = "scale";

    template <Scalar T>
    static void forward(Inputs<T> in, const OpAttrs<T>& attrs, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& x = *in[0];
        out.resize(x.shape());
        for (std::size_t k = 0; k < x.size(); ++k) out[k] = attrs.scalar * x[k];
    }

    template <Scalar T>
    static void vjp(Inputs<T>, const OpAttrs<T>& attrs, const Tensor<T>&, const Tensor<T>&, const Tensor<T>& G,
                    std::size_t, Tensor<T>& grad) {
        for (std::size_t k = 0; k < G.size(); ++k) grad[k] = attrs.scalar * G[k];
    }

    template <Scalar T>
    static OpCost cost(Inputs<T> in, const OpAttrs<T>&) {
        return {in[0]->size(), in[0]->size()};
    }
};

template <Scalar T>
Var<T> scale(const Var<T>& X, const T& c) {
    checks::non_empty(Scale::name, "X", X);
    if (!is_finite(c)) throw value_error(fmt::format("scale: the factor {} is not finite", to_double(c)));
    return X.tape().template record<Scale>({X}, OpAttrs<T>{c, {}});
}

}  // namespace tapegrad
