/// \file
/// repeat_heads: repeats each key/value head for the group of query heads that share it: grouped-
/// query attention (LLaMA 2 70B, Mistral; H_kv = 1 is multi-query) as Hugging Face's repeat_kv.
///   X [..., H_kv, T, d] -> Y [..., H_kv·g, T, d]      (Settings{groups = g}, g ≥ 1)
///   Y_{.., h, t, c} = X_{.., ⌊h/g⌋, t, c}: query head h reads key/value head ⌊h/g⌋, so heads
///   h = kv·g .. kv·g + g − 1 form kv's group (consecutive, as repeat_kv and Meta's code).
/// VJP: dX_{.., kv, t, c} = Σ_{r<g} G_{.., kv·g + r, t, c}: each key/value head's gradient is the
///   sum over the query heads of its group. Taking one member's gradient (r = 0 only), or
///   averaging instead of summing, are the GQA kernels' classic wrong dK, dV; both are rejected
///   (tests/test_decoder_ops.cpp).
/// Attention composes it: fused_attention(Q, repeat_heads(K, g), repeat_heads(V, g)) for Q
/// [B, H, T, d] and K, V [B, H/g, T, d], on the composed path and the fused kernel alike.
#pragma once

#include "autodiff/instances.hpp"
#include "autodiff/tape.hpp"
#include "ops/checks.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace tapegrad {

struct RepeatHeads {
    static constexpr std::string_view name = "repeat_heads";
    static constexpr Arity arity{1};

    struct Settings {
        std::size_t groups;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("groups", s.groups)}; }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return repeat_heads(in[0], s.groups);
    }

    static Shape output_shape(const Shape& x, std::size_t groups) {
        std::vector<std::size_t> dims(x.dims().begin(), x.dims().end());
        dims[dims.size() - 3] *= groups;
        return Shape(std::span<const std::size_t>(dims));
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& X = *in[0];
        const std::size_t head = X.rows() * X.cols(), heads = X.size() / head;  // every head of every batch
        Y.resize(output_shape(X.shape(), s.groups));
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t r = 0; r < s.groups; ++r)
                std::copy_n(X.data().data() + h * head, head, Y.data().data() + (h * s.groups + r) * head);
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const Tensor<T>& X = *at.in[0];
        const std::size_t head = X.rows() * X.cols(), heads = X.size() / head;
        for (std::size_t h = 0; h < heads; ++h) {
            T* dx = dX.data().data() + h * head;
            const T* G = at.G.data().data() + h * s.groups * head;
            std::copy_n(G, head, dx);
            for (std::size_t r = 1; r < s.groups; ++r)
                for (std::size_t c = 0; c < head; ++c) dx[c] += G[r * head + c];
        }
    }
};

/// Each head of X [..., H_kv, T, d] repeated `groups` times in place: [..., H_kv·groups, T, d].
template <Scalar T>
Var<T> repeat_heads(const Var<T>& X, std::size_t groups) {
    checks::non_empty(RepeatHeads::name, "X", X);
    const Shape& x = X.shape();
    if (x.rank() < 3) {
        throw shape_error(
            fmt::format("repeat_heads: X must be [..., H_kv, T, d] (rank 3 or more), got {}", x.to_string()));
    }
    if (groups == 0) throw shape_error(fmt::format("repeat_heads: groups must be at least 1 (X is {})", x.to_string()));
    if (groups > std::numeric_limits<std::size_t>::max() / x.size()) {
        throw shape_error(fmt::format("repeat_heads: {} groups of X {} overflow the element count", groups, x.to_string()));
    }
    return X.tape().template record<RepeatHeads>({X}, RepeatHeads::Settings{groups});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> repeat_heads<T>(const Var<T>&, std::size_t);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
