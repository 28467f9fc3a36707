/// \file
/// rms_norm: scales each row (the last dimension) by the inverse of its root mean square, then by a
/// learned gain (LLaMA's and Mistral's normalisation, as torch.nn.RMSNorm and Meta's LLaMA code).
///   X [..., D] viewed as N rows of width D, gain g [D] -> Y [..., D]
///   r = 1/√((1/D) Σ_j x_j² + ε)   (ε INSIDE the square root; RmsNormSettings::epsilon, 1e-6 by
///                                  default, LLaMA's norm_eps),
///   x̂_j = x_j·r,   y_j = g_j·x̂_j.
/// No mean is taken out (that is layer_norm): the row keeps its direction, only its length is set.
/// forward saves r (one per row); the VJP recomputes x̂ = x·r. With ĝ = G∘g (the upstream gradient
/// through the gain):
///   dX: dx_j = r·(ĝ_j − x̂_j·mean_i(ĝ_i·x̂_i))
///       because ∂r/∂x_j = −r³·x_j/D, so ∂y_i/∂x_j = g_i·r·(δ_ij − x̂_i·x̂_j/D).
///       Computed as (r³/D)·(ĝ_j·(S_j + D·ε) − x_j·P_j), S_j = Σ_{k≠j} x_k², P_j = Σ_{k≠j} ĝ_k·x_k
///       (equal, since r²·(Σ x² + D·ε) = D, and the k = j terms cancel exactly), with S_j and P_j
///       summed over the other elements (a prefix plus a suffix sum), never as a total minus x_j²:
///       so at width 1 dx = r·ε·ĝ/(x² + ε) keeps every digit, and so does a row one element
///       dominates, where the first form loses log10(x_j²/(S_j + D·ε)) of them (5.8 at width 1,
///       |x| = 0.8, ε = 1e-6).
///       Dropping the second term gives r·ĝ (the gradient of a fixed scale), wrong wherever x̂ ≠ 0;
///       dropping the gain from it (r·(G − x̂·mean(G∘x̂))) is llm.c's bug #763; ggml #1491's
///       rms_norm_back differs from it on every row.
///   dg_j = Σ_rows G_j·x̂_j   (each row uses g once, with slope x̂).
/// float and double rows go to compiled kernels (src/cpu/level_kernels.hpp): the same formulas,
/// their sums vectorised in a fixed order, and S_j, P_j taken as the row's total less j's own term
/// except at the one element whose x_j² is most of Σ x², where they are summed over the others as
/// here (so it keeps its digits too).
#pragma once

#include "autodiff/instances.hpp"
#include "autodiff/tape.hpp"
#include "ops/checks.hpp"
#include "ops/fast/kernels.hpp"

#include <fmt/core.h>

#include <vector>

namespace tapegrad {

struct RmsNormSettings {
    double epsilon = 1e-6;  ///< added to the mean square inside the square root (LLaMA's norm_eps)
};

struct RmsNorm {
    static constexpr std::string_view name = "rms_norm";
    static constexpr Arity arity{2};

    /// ε held in the tape's precision (converted exactly from the double the user gave).
    template <Scalar T>
    struct Settings {
        T epsilon;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("epsilon", s.epsilon)}; }
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return rms_norm(in[0], in[1], RmsNormSettings{double(s.epsilon)});  // a float ε is exact as a double
    }

    /// saved = r, one per row
    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        using std::sqrt;
        const Tensor<T>& X = *in[0];
        const Tensor<T>& g = *in[1];
        const std::size_t D = X.cols(), N = X.size() / D;
        Y.resize(X.shape());
        saved.resize(Shape{N});
        if constexpr (has_compiled_kernels<T>) {  // the same formula, vectorised (src/cpu/level_kernels.hpp)
            for (std::size_t n = 0; n < N; ++n) {
                saved[n] = op_kernels<T>().rms_norm_row(X.data().data() + n * D, g.data().data(), D, s.epsilon,
                                                        Y.data().data() + n * D);
            }
            return;
        }
        for (std::size_t n = 0; n < N; ++n) {
            const T* x = X.data().data() + n * D;
            T squares(0);
            for (std::size_t j = 0; j < D; ++j) squares += x[j] * x[j];
            const T r = T(1) / T(sqrt(T(squares / T(D) + s.epsilon)));
            saved[n] = r;
            for (std::size_t j = 0; j < D; ++j) Y[n * D + j] = g[j] * T(x[j] * r);
        }
    }

    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& din) {
        const Tensor<T>& X = *at.in[0];
        const std::size_t D = X.cols(), N = X.size() / D;
        if (which == 0) {
            if constexpr (has_compiled_kernels<T>) {  // the same formula, vectorised (see the top)
                for (std::size_t n = 0; n < N; ++n) {
                    op_kernels<T>().rms_norm_vjp_row(X.data().data() + n * D, at.in[1]->data().data(),
                                                     at.G.data().data() + n * D, D, at.saved[n], s.epsilon,
                                                     din.data().data() + n * D);
                }
                return;
            }
            std::vector<T> after(2 * (D + 1));  // the suffix sums of one row
            for (std::size_t n = 0; n < N; ++n) input_row(s.epsilon, at, n, D, after, din);
            return;
        }
        din.fill(T(0));  // dg_j = Σ_rows G_j·x̂_j
        for (std::size_t n = 0; n < N; ++n)
            for (std::size_t j = 0; j < D; ++j) din[j] += at.G[n * D + j] * T(X[n * D + j] * at.saved[n]);
    }

    /// dx for row n: (r³/D)·(ĝ_j·(S_j + D·ε) − x_j·P_j), S_j and P_j over k ≠ j (see the top):
    /// `after` holds Σ_{k≥j} x_k² at j and Σ_{k≥j} ĝ_k·x_k at D + 1 + j.
    template <Scalar T>
    static void input_row(const T& epsilon, const VjpArgs<T>& at, std::size_t n, std::size_t D, std::vector<T>& after,
                          Tensor<T>& dX) {
        const Tensor<T>& g = *at.in[1];
        const T* x = at.in[0]->data().data() + n * D;
        const T* G = at.G.data().data() + n * D;
        const T& r = at.saved[n];
        T* const S_after = after.data();
        T* const P_after = after.data() + D + 1;
        S_after[D] = P_after[D] = T(0);
        for (std::size_t j = D; j-- > 0;) {
            S_after[j] = T(x[j] * x[j]) + S_after[j + 1];
            P_after[j] = T(T(G[j] * g[j]) * x[j]) + P_after[j + 1];
        }
        const T scale = r * r * r / T(D), D_epsilon = T(D) * epsilon;
        T S_before(0), P_before(0);
        for (std::size_t j = 0; j < D; ++j) {
            const T g_hat = G[j] * g[j];
            const T S_j = S_before + S_after[j + 1], P_j = P_before + P_after[j + 1];
            dX[n * D + j] = scale * (g_hat * T(S_j + D_epsilon) - x[j] * P_j);
            S_before += x[j] * x[j];
            P_before += g_hat * x[j];
        }
    }

    template <Scalar T>
    static OpCost cost(const Settings<T>&, Inputs<T> in) {
        return {3 * in[0]->size(), 6 * in[0]->size()};
    }
};

/// Y = rms_norm(X)·gain over the last dimension of X; gain is [D].
template <Scalar T>
Var<T> rms_norm(const Var<T>& X, const Var<T>& gain, RmsNormSettings settings = {}) {
    checks::non_empty(RmsNorm::name, "X", X);
    if (X.shape().rank() == 0) throw shape_error("rms_norm: X must have a feature dimension, got a scalar");
    const std::size_t D = X.shape().cols();
    if (gain.shape().rank() != 1 || gain.shape()[0] != D) {
        throw shape_error(fmt::format("rms_norm: gain is {} but X is {}: it must be [{}]", gain.shape().to_string(),
                                      X.shape().to_string(), D));
    }
    if (!(settings.epsilon > 0)) {
        throw value_error(
            fmt::format("rms_norm: epsilon {} must be positive (X is {})", settings.epsilon, X.shape().to_string()));
    }
    return X.tape().template record<RmsNorm>({X, gain}, RmsNorm::Settings<T>{T(settings.epsilon)});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> rms_norm<T>(const Var<T>&, const Var<T>&, RmsNormSettings);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
