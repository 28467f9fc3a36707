/// \file
/// dropout: zeroes each element with probability p and scales the kept ones by 1/(1−p), so the
/// expected output equals the input (attention dropout on the weights A).
///   X [...] , M [...] (same shape, 0 = dropped, 1 = kept; a constant)  ->  Y [...]
///   Y_k = X_k·M_k / (1−p)     (Settings::factor holds 1/(1−p))
/// The keep-mask M is drawn once, from the caller's explicit seeded generator, when the op is
/// recorded, and lives on the tape as a constant input. So forward is a pure function of (X, M)
/// (the checker replays it with the same M) and the VJP reuses exactly the mask of the forward:
///   dX_k = G_k·M_k / (1−p)
/// because Y_k is linear in X_k with slope M_k/(1−p). M has no gradient.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <cstdint>
#include <random>

namespace tapegrad {

struct Dropout {
    static constexpr std::string_view name = "dropout";
    static constexpr Arity arity{2};

    /// 1/(1−p) in the tape's own precision, so a 50-digit graph is not capped at double's 16 digits.
    template <Scalar T>
    struct Settings {
        T factor;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("factor", s.factor)}; }
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return record_dropout(in[0], in[1], s.factor);
    }

    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& X = *in[0];
        const Tensor<T>& M = *in[1];
        Y.resize(X.shape());
        for (std::size_t k = 0; k < X.size(); ++k) Y[k] = M[k] != T(0) ? T(s.factor * X[k]) : T(0);
    }

    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const Tensor<T>& M = *at.in[1];
        for (std::size_t k = 0; k < at.G.size(); ++k) dX[k] = M[k] != T(0) ? T(s.factor * at.G[k]) : T(0);
    }

    template <Scalar T>
    static OpCost cost(const Settings<T>&, Inputs<T> in) {
        return {in[0]->size(), in[0]->size()};
    }
};

/// Rejects p outside [0, 1): p = 1 would drop everything and divide by zero.
inline void check_dropout_probability(std::string_view where, double p) {
    if (!(p >= 0.0 && p < 1.0)) {
        throw value_error(fmt::format("{}: dropout probability p = {} is outside [0, 1)", where, p));
    }
}

/// Draws a keep-mask of `shape` (1 kept with probability 1−p, 0 dropped). Uses the generator's raw
/// 64-bit output (53 bits of it as a uniform in [0, 1)) rather than std::bernoulli_distribution,
/// whose algorithm differs between standard libraries: one seed gives one mask everywhere.
inline Tensor<double> draw_keep_mask(const Shape& shape, double p, std::mt19937_64& generator) {
    check_dropout_probability("dropout", p);
    Tensor<double> keep(shape);
    for (double& k : keep.data()) {
        const double u = static_cast<double>(generator() >> 11) * 0x1.0p-53;
        k = u >= p ? 1.0 : 0.0;
    }
    return keep;
}

/// Dropout of X with the keep-mask `keep` (values 0 or 1, X's shape) and the factor 1/(1−p) given as
/// recorded: the checks and the record shared by dropout_with_mask and a loaded tape (io/tape_file.hpp,
/// which holds the factor, not p). value_error for a factor below 1 or not finite.
template <Scalar T>
Var<T> record_dropout(const Var<T>& X, const Var<T>& keep, const T& factor) {
    checks::same_shape(Dropout::name, X, keep);
    if (!(factor >= T(1)) || !is_finite(factor)) {
        throw value_error(fmt::format("dropout: factor 1/(1 - p) = {} is not a finite number of at least 1",
                                      to_double(factor)));
    }
    for (std::size_t k = 0; k < keep.shape().size(); ++k) {
        const T& m = keep.value()[k];
        if (m != T(0) && m != T(1)) {
            throw value_error(fmt::format("dropout: keep-mask value {} at {}; a keep-mask holds 0 or 1",
                                          to_double(m), index_string(keep.shape(), k)));
        }
    }
    return X.tape().template record<Dropout>({X, keep}, Dropout::Settings<T>{factor});
}

/// Dropout with an explicit keep-mask (a constant on the tape, values 0 or 1) and its p.
template <Scalar T>
Var<T> dropout_with_mask(const Var<T>& X, const Var<T>& keep, double p) {
    check_dropout_probability("dropout", p);
    return record_dropout(X, keep, T(T(1) / (T(1) - T(p))));
}

/// Dropout whose keep-mask is drawn now from `generator` (advancing it). p = 0 keeps everything
/// (Y = X exactly); the same generator state always gives the same mask.
template <Scalar T>
Var<T> dropout(const Var<T>& X, double p, std::mt19937_64& generator) {
    checks::non_empty(Dropout::name, "X", X);
    check_dropout_probability("dropout", p);
    const Var<T> keep = X.tape().constant(tensor_cast<T>(draw_keep_mask(X.shape(), p, generator)), "dropout keep-mask");
    return dropout_with_mask(X, keep, p);
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> dropout_with_mask<T>(const Var<T>&, const Var<T>&, double); \
    TAPEGRAD_INSTANCE Var<T> dropout<T>(const Var<T>&, double, std::mt19937_64&);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
