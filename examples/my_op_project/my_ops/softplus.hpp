// my_ops::softplus: an op of this project's own, added to tapegrad as the library adds its ops
// (one struct: name, arity, settings, how to record it again, forward, VJP; one public function
// that checks its argument and records it), registered with one line (my_ops/register.cpp, or
// tapegrad::register_op<my_ops::Softplus>() anywhere before it is checked, saved or loaded). A
// smooth ReLU:
//   A [...] -> Y [...],   y = log(1 + e^a) = max(a, 0) + log(1 + e^(−|a|))
//   (the second form never overflows: e^(−|a|) ≤ 1, and log1p keeps the digits of a tiny one).
// VJP: dA = G ∘ σ(A), since d/da log(1 + e^a) = e^a / (1 + e^a) = σ(a), taken in the stable
//   form 1 / (1 + e^(−a)) for a ≥ 0 and e^a / (1 + e^a) below.
#pragma once

#include <tapegrad.hpp>

#include <fmt/core.h>

#include <span>
#include <string_view>

namespace my_ops {

using tapegrad::Inputs;
using tapegrad::Scalar;
using tapegrad::Tensor;
using tapegrad::Var;
using tapegrad::VjpArgs;

template <Scalar T>
Var<T> softplus(const Var<T>& A);

struct Softplus {
    static constexpr std::string_view name = "softplus";  // saved as "user:softplus"
    static constexpr tapegrad::Arity arity{1};
    using Settings = tapegrad::NoSettings;  // none: no `fields` to declare
    /// Records the op again (a loaded tape) through the public function, which checks its argument.
    template <Scalar T>
    static Var<T> record(const Settings&, std::span<const Var<T>> in) {
        return softplus(in[0]);
    }

    template <Scalar T>
    static void forward(const Settings&, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        using std::abs;
        using std::exp;
        using std::log1p;
        const Tensor<T>& A = *in[0];
        Y.resize(A.shape());
        for (std::size_t k = 0; k < A.size(); ++k) {
            const T positive_part = A[k] > T(0) ? A[k] : T(0);
            Y[k] = positive_part + log1p(T(exp(-abs(A[k]))));
        }
    }

    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        using std::exp;
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < A.size(); ++k) {
            const T sigma = A[k] >= T(0) ? T(1) / (1 + T(exp(-A[k]))) : T(exp(A[k])) / (1 + T(exp(A[k])));
            dA[k] = at.G[k] * sigma;
        }
    }
};

// Y = softplus(A), elementwise.
template <Scalar T>
Var<T> softplus(const Var<T>& A) {
    if (A.shape().size() == 0) {
        throw tapegrad::shape_error(fmt::format("softplus: A is empty (shape {})", A.shape().to_string()));
    }
    return A.tape().template record<Softplus>({A});
}

}  // namespace my_ops
