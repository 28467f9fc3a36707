/// \file
/// rope: rotary position embeddings on the last axis (LLaMA's, Mistral's and GPT-J's queries and
/// keys): each pair of features of row t is rotated by an angle that grows with the row's position.
///   X [..., T, d] (d even) -> Y [..., T, d];   position of row t: p_t = first_position + t
///   θ_{t,i} = p_t · base^(−2i/d),   i = 0 .. d/2 − 1   (base 10000 by default)
///   the pair (j, k) of frequency i, by RopePairing:
///     interleaved (the paper, GPT-J, Meta's LLaMA code):  j = 2i,  k = 2i + 1
///     halves      (Hugging Face's LLaMA, rotate_half):    j = i,   k = i + d/2
///   y_j = x_j·cos θ − x_k·sin θ,   y_k = x_j·sin θ + x_k·cos θ.
/// `first_position` makes generation rotate by absolute position: the rows of a new block of a
/// key/value cache at positions n, n+1, ... are rope(X_new, {.first_position = n}).
/// VJP: the rotation R(θ) is orthogonal, so dX = R(θ)ᵀ·G = R(−θ)·G per pair:
///   dx_j = G_j·cos θ + G_k·sin θ,   dx_k = −G_j·sin θ + G_k·cos θ.
///   Using R(θ) instead of its transpose (sin's sign kept) is the classic slip; pairing the
///   gradient with the other convention's features (halves for interleaved) rotates the wrong
///   features; both are rejected (tests/test_decoder_ops.cpp).
/// forward saves the table cos θ, sin θ ([T, d/2] each), computed once per call in the tape's own
/// precision and shared by every matrix of the batch.
#pragma once

#include "autodiff/instances.hpp"
#include "autodiff/tape.hpp"
#include "ops/checks.hpp"

#include <fmt/core.h>

#include <array>
#include <cmath>
#include <span>
#include <string_view>

namespace tapegrad {

enum class RopePairing {
    interleaved,  ///< pairs (2i, 2i+1): the paper, GPT-J, Meta's LLaMA code (default)
    halves,       ///< pairs (i, i + d/2): Hugging Face's rotate_half
};

/// The pairings' names, by value (a saved tape's "pairing", autodiff/settings.hpp).
inline constexpr std::array<std::string_view, 2> rope_pairing_names{"interleaved", "halves"};
constexpr std::span<const std::string_view> choices(RopePairing) { return rope_pairing_names; }

struct RopeSettings {
    double base = 10000;                              ///< θ_i = p·base^(−2i/d)
    RopePairing pairing = RopePairing::interleaved;  ///< which features form a pair
    std::size_t first_position = 0;                   ///< the position of X's first row
};

struct Rope {
    static constexpr std::string_view name = "rope";
    static constexpr Arity arity{1};

    /// The base held in the tape's precision (converted exactly from the double the user gave).
    template <Scalar T>
    struct Settings {
        T base;
        RopePairing pairing;
        std::size_t first_position;
    };
    static constexpr auto fields(auto& s) {
        return std::tuple{field("base", s.base), field("pairing", s.pairing), field("first_position", s.first_position)};
    }
    template <Scalar T>
    static Var<T> record(const Settings<T>& s, std::span<const Var<T>> in) {
        return rope(in[0], RopeSettings{double(s.base), s.pairing, s.first_position});  // a float base is exact as a double
    }

    /// The features (j, k) of pair i in a row of width d.
    static std::array<std::size_t, 2> pair(RopePairing pairing, std::size_t i, std::size_t d) {
        return pairing == RopePairing::interleaved ? std::array{2 * i, 2 * i + 1} : std::array{i, i + d / 2};
    }

    /// saved = [cos θ (T·d/2) | sin θ (T·d/2)], row t's pair i at t·d/2 + i.
    template <Scalar T>
    static void angles(const Settings<T>& s, std::size_t rows, std::size_t d, Tensor<T>& saved) {
        using std::cos;
        using std::log;
        using std::exp;
        using std::sin;
        const std::size_t half = d / 2;
        saved.resize(Shape{2 * rows * half});
        const T log_base = log(s.base);
        for (std::size_t i = 0; i < half; ++i) {
            const T frequency = exp(T(-T(2 * i) / T(d) * log_base));  // base^(−2i/d)
            for (std::size_t t = 0; t < rows; ++t) {
                const T theta = T(s.first_position + t) * frequency;
                saved[t * half + i] = cos(theta);
                saved[rows * half + t * half + i] = sin(theta);
            }
        }
    }

    /// Rotates every pair of every row of `from` by R(θ) (`sign` +1) or R(θ)ᵀ (`sign` −1) into `to`.
    template <Scalar T>
    static void rotate(RopePairing pairing, const Tensor<T>& table, const Tensor<T>& from, Tensor<T>& to, int sign) {
        const std::size_t rows = from.rows(), d = from.cols(), half = d / 2, matrices = from.size() / (rows * d);
        for (std::size_t b = 0; b < matrices; ++b)
            for (std::size_t t = 0; t < rows; ++t) {
                const T* x = from.data().data() + (b * rows + t) * d;
                T* y = to.data().data() + (b * rows + t) * d;
                for (std::size_t i = 0; i < half; ++i) {
                    const auto [j, k] = pair(pairing, i, d);
                    const T& c = table[t * half + i];
                    const T s = sign > 0 ? table[rows * half + t * half + i] : T(-table[rows * half + t * half + i]);
                    y[j] = x[j] * c - x[k] * s;
                    y[k] = x[j] * s + x[k] * c;
                }
            }
    }

    template <Scalar T>
    static void forward(const Settings<T>& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        const Tensor<T>& X = *in[0];
        angles(s, X.rows(), X.cols(), saved);
        Y.resize(X.shape());
        rotate(s.pairing, saved, X, Y, +1);
    }

    template <Scalar T>
    static void vjp(const Settings<T>& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        rotate(s.pairing, at.saved, at.G, dX, -1);
    }

    template <Scalar T>
    static OpCost cost(const Settings<T>&, Inputs<T> in) {
        return {3 * in[0]->size(), 3 * in[0]->size()};
    }
};

/// Rotary position embeddings on the last axis of X [..., T, d] (d even), rows at positions
/// first_position, first_position + 1, ...
template <Scalar T>
Var<T> rope(const Var<T>& X, RopeSettings settings = {}) {
    checks::matrix(Rope::name, "X", X);
    const Shape& x = X.shape();
    if (x.cols() % 2 != 0) {
        throw shape_error(fmt::format("rope: X is {}: its last axis ({}) must be even, features rotate in pairs",
                                      x.to_string(), x.cols()));
    }
    if (!(settings.base > 0) || !std::isfinite(settings.base)) {
        throw value_error(fmt::format("rope: base {} must be positive and finite (X is {})", settings.base,
                                      x.to_string()));
    }
    if (settings.pairing != RopePairing::interleaved && settings.pairing != RopePairing::halves) {
        throw value_error(fmt::format("rope: pairing {} is neither interleaved nor halves", int(settings.pairing)));
    }
    // A position is an index into a sequence a tensor holds, so at most max_elements: beyond it a
    // saved tape would hold a setting its loader refuses (docs/tape-file.md), so it is refused here.
    if (settings.first_position > max_elements) {
        throw value_error(fmt::format("rope: first_position {} is above {}, the most elements a tensor holds (X is {})",
                                      settings.first_position, max_elements, x.to_string()));
    }
    return X.tape().template record<Rope>(
        {X}, Rope::Settings<T>{T(settings.base), settings.pairing, settings.first_position});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> rope<T>(const Var<T>&, RopeSettings);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
