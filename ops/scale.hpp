/// \file
/// scale: multiplies by a constant, Y = c·X (the attention scale 1/√d; dropout's 1/(1-p)).
/// VJP: dX = c·G  (∂Y_i/∂X_i = c).
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/parallel.hpp"
#include "autodiff/tape.hpp"

namespace tapegrad {

struct Scale {
    static constexpr std::string_view name = "scale";
    static constexpr Arity arity{1};

    /// The factor in the tape's own precision (1/√d computed in double would cap a 50-digit graph
    /// at 16 digits).
    template <Scalar T>
    struct Settings {
        T c;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("c", s.c)}; }
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return scale(in[0], s.c);
    }

    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& x = *in[0];
        out.resize(x.shape());
        parallel_chunks(x.size(), elementwise_grain, [&](std::size_t first, std::size_t last) {
            for (std::size_t k = first; k < last; ++k) out[k] = s.c * x[k];
        });
    }

    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        parallel_chunks(at.G.size(), elementwise_grain, [&](std::size_t first, std::size_t last) {
            for (std::size_t k = first; k < last; ++k) grad[k] = s.c * at.G[k];
        });
    }

    template <Scalar T>
    static OpCost cost(const Settings<T>&, Inputs<T> in) {
        return {in[0]->size(), in[0]->size()};
    }
};

template <Scalar T>
Var<T> scale(const Var<T>& X, const T& c) {
    checks::non_empty(Scale::name, "X", X);
    return X.tape().template record<Scale>({X}, Scale::Settings<T>{checks::finite(Scale::name, "factor", c)});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> scale<T>(const Var<T>&, const T&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
