/// \file
/// split_heads: cuts the feature dimension into H heads and moves the head axis in front of time,
/// so every head becomes one matrix of the batch (per-head attention is then batched matmuls).
///   X [..., T, H·dh] -> Y [..., H, T, dh]      (X of rank 2 or 3; Settings{heads = H})
///   Y_{b,h,t,c} = X_{b,t,h·dh+c}
/// VJP: dX_{b,t,h·dh+c} = G_{b,h,t,c}: a pure permutation, so the gradient is the inverse
/// permutation of G (that is merge_heads).
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <vector>

namespace tapegrad {

namespace detail {

/// Moves between [B, T, H, dh] (features grouped by head) and [B, H, T, dh]. `to_heads` reads the
/// first layout and writes the second; otherwise the reverse.
template <Scalar T>
void permute_heads(const T* source, T* target, std::size_t batch, std::size_t H, std::size_t time, std::size_t dh,
                   bool to_heads) {
    for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t t = 0; t < time; ++t)
            for (std::size_t h = 0; h < H; ++h) {
                const std::size_t grouped = ((b * time + t) * H + h) * dh;  // [B, T, H, dh]
                const std::size_t headed = ((b * H + h) * time + t) * dh;   // [B, H, T, dh]
                if (to_heads) {
                    std::copy_n(source + grouped, dh, target + headed);
                } else {
                    std::copy_n(source + headed, dh, target + grouped);
                }
            }
}

}  // namespace detail

struct SplitHeads {
    static constexpr std::string_view name = "split_heads";
    static constexpr Arity arity{1};

    static Shape output_shape(const Shape& x, std::size_t H) {
        std::vector<std::size_t> dims(x.dims().begin(), x.dims().end() - 2);
        dims.insert(dims.end(), {H, x.rows(), x.cols() / H});
        return Shape(std::span<const std::size_t>(dims));
    }

    struct Settings {
        std::size_t heads;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("heads", s.heads)}; }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return split_heads(in[0], s.heads);
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& X = *in[0];
        const std::size_t H = s.heads;
        Y.resize(output_shape(X.shape(), H));
        detail::permute_heads(X.data().data(), Y.data().data(), X.shape().batch(), H, X.rows(), X.cols() / H, true);
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const Tensor<T>& X = *at.in[0];
        const std::size_t H = s.heads;
        detail::permute_heads(at.G.data().data(), dX.data().data(), X.shape().batch(), H, X.rows(), X.cols() / H, false);
    }
};

template <Scalar T>
Var<T> split_heads(const Var<T>& X, std::size_t heads) {
    checks::matrix(SplitHeads::name, "X", X);
    const Shape& x = X.shape();
    if (x.rank() > 3) {
        throw shape_error(fmt::format("split_heads: X must be [T, D] or [B, T, D], got {}", x.to_string()));
    }
    if (heads == 0 || x.cols() % heads != 0) {
        throw shape_error(fmt::format("split_heads: width {} of X {} does not split into {} heads", x.cols(),
                                      x.to_string(), heads));
    }
    return X.tape().template record<SplitHeads>({X}, SplitHeads::Settings{heads});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> split_heads<T>(const Var<T>&, std::size_t);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
