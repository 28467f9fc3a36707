/// \file
/// layer_norm: normalises each row (the last dimension) to mean 0 and variance 1, then scales and
/// shifts it by a learned gain and bias (the transformer block's normalisation, as torch.nn.LayerNorm).
///   X [..., D] viewed as N rows of width D, gain g [D], bias b [D] -> Y [..., D]
///   μ = (1/D) Σ_j x_j,   σ² = (1/D) Σ_j (x_j − μ)²   (the biased variance, as PyTorch),
///   r = 1/√(σ² + ε)      (ε INSIDE the square root; Settings::epsilon, 1e-5 by default),
///   x̂_j = (x_j − μ)·r,   y_j = g_j·x̂_j + b_j.
/// forward saves x̂ (N·D values) and r (one per row); the VJP needs nothing else (llm.c's
/// layernorm_backward). With ĝ = G∘g (the upstream gradient through the gain):
///   dX: dx_j = r·(ĝ_j − mean_i ĝ_i − x̂_j·mean_i(ĝ_i·x̂_i))
///       because ∂x̂_i/∂x_j = r·(δ_ij − 1/D) − x̂_i·x̂_j·r/D: the 1/D from μ, the x̂_i x̂_j from σ².
///       Dropping the σ² term gives r·(ĝ − mean ĝ), which is wrong wherever x̂ ≠ 0; dropping the μ
///       term gives rows that no longer sum to zero (Y is invariant to adding a constant to a row).
///   dg_j = Σ_rows G_j·x̂_j,   db_j = Σ_rows G_j   (each row uses g and b once, with slopes x̂ and 1).
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

namespace tapegrad {

struct LayerNormSettings {
    double epsilon = 1e-5;  ///< added to σ² inside the square root (PyTorch's default)
};

struct LayerNorm {
    static constexpr std::string_view name = "layer_norm";
    static constexpr Arity arity{3};

    /// ε held in the tape's precision (converted exactly from the double the user gave).
    template <Scalar T>
    struct Settings {
        T epsilon;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("epsilon", s.epsilon)}; }
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return layer_norm(in[0], in[1], in[2], LayerNormSettings{double(s.epsilon)});  // a float ε is exact as a double
    }

    /// saved = [x̂ (N·D values) | r (N values)]
    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        using std::sqrt;
        const Tensor<T>& X = *in[0];
        const Tensor<T>& g = *in[1];
        const Tensor<T>& b = *in[2];
        const std::size_t D = X.cols(), N = X.size() / D;
        Y.resize(X.shape());
        saved.resize(Shape{N * D + N});
        for (std::size_t n = 0; n < N; ++n) {
            const T* x = X.data().data() + n * D;
            T* x_hat = saved.data().data() + n * D;
            T mean(0), variance(0);
            for (std::size_t j = 0; j < D; ++j) mean += x[j];
            mean /= T(D);
            for (std::size_t j = 0; j < D; ++j) variance += (x[j] - mean) * (x[j] - mean);
            variance /= T(D);
            const T r = T(1) / T(sqrt(T(variance + s.epsilon)));
            saved[N * D + n] = r;
            for (std::size_t j = 0; j < D; ++j) {
                x_hat[j] = (x[j] - mean) * r;
                Y[n * D + j] = g[j] * x_hat[j] + b[j];
            }
        }
    }

    template <Scalar T>
    static void vjp(const Settings<T>&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& din) {
        const std::size_t D = at.in[0]->cols(), N = at.in[0]->size() / D;
        const T* x_hat = at.saved.data().data();
        if (which == 0) {
            for (std::size_t n = 0; n < N; ++n) input_row(at, n, D, x_hat + n * D, at.saved[N * D + n], din);
            return;
        }
        din.fill(T(0));
        for (std::size_t n = 0; n < N; ++n) {
            for (std::size_t j = 0; j < D; ++j) din[j] += which == 1 ? at.G[n * D + j] * x_hat[n * D + j] : at.G[n * D + j];
        }
    }

    /// dx for row n: r·(ĝ − mean ĝ − x̂·mean(ĝ∘x̂)).
    template <Scalar T>
    static void input_row(const VjpArgs<T>& at, std::size_t n, std::size_t D, const T* x_hat, const T& r,
                          Tensor<T>& dX) {
        const Tensor<T>& g = *at.in[1];
        const T* G = at.G.data().data() + n * D;
        T mean_g(0), mean_gx(0);
        for (std::size_t j = 0; j < D; ++j) {
            mean_g += G[j] * g[j];
            mean_gx += G[j] * g[j] * x_hat[j];
        }
        mean_g /= T(D);
        mean_gx /= T(D);
        for (std::size_t j = 0; j < D; ++j) dX[n * D + j] = r * (G[j] * g[j] - mean_g - x_hat[j] * mean_gx);
    }

    template <Scalar T>
    static OpCost cost(const Settings<T>&, Inputs<T> in) {
        return {4 * in[0]->size(), 6 * in[0]->size()};
    }
};

/// Y = layer_norm(X)·gain + bias over the last dimension of X; gain and bias are [D].
template <Scalar T>
Var<T> layer_norm(const Var<T>& X, const Var<T>& gain, const Var<T>& bias, LayerNormSettings settings = {}) {
    checks::non_empty(LayerNorm::name, "X", X);
    if (X.shape().rank() == 0) throw shape_error("layer_norm: X must have a feature dimension, got a scalar");
    const std::size_t D = X.shape().cols();
    for (const auto& [what, v] : {std::pair{"gain", gain}, std::pair{"bias", bias}}) {
        if (v.shape().rank() != 1 || v.shape()[0] != D) {
            throw shape_error(fmt::format("layer_norm: {} is {} but X is {}: it must be [{}]", what,
                                          v.shape().to_string(), X.shape().to_string(), D));
        }
    }
    if (!(settings.epsilon > 0)) {
        throw value_error(fmt::format("layer_norm: epsilon {} must be positive (X is {})", settings.epsilon,
                                      X.shape().to_string()));
    }
    return X.tape().template record<LayerNorm>({X, gain, bias}, LayerNorm::Settings<T>{T(settings.epsilon)});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> layer_norm<T>(const Var<T>&, const Var<T>&, const Var<T>&, LayerNormSettings);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
