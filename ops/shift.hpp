/// \file
/// shift: adds a constant to every element, Y = X + c (a + 1.0 and 1.0 − a in ops/operators.hpp).
///   X [any shape] -> Y [same shape]; c a finite number in the tape's precision.
/// VJP: dX = G  (∂Y_k/∂X_k = 1; the constant has no gradient).
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Shift {
    static constexpr std::string_view name = "shift";
    static constexpr Arity arity{1};

    /// The constant in the tape's own precision (a 50-digit 1/3 stays 50 digits).
    template <Scalar T>
    struct Settings {
        T c;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("c", s.c)}; }
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return shift(in[0], s.c);
    }

    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& x = *in[0];
        out.resize(x.shape());
        for (std::size_t k = 0; k < x.size(); ++k) out[k] = x[k] + s.c;
    }

    template <Scalar T>
    static void vjp(const Settings<T>&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        std::copy(at.G.data().begin(), at.G.data().end(), grad.data().begin());
    }
};

template <Scalar T>
Var<T> shift(const Var<T>& X, const T& c) {
    checks::non_empty(Shift::name, "X", X);
    return X.tape().template record<Shift>({X}, Shift::Settings<T>{checks::finite(Shift::name, "constant", c)});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> shift<T>(const Var<T>&, const T&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
