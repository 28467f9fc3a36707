/// \file
/// permute: reorders the axes of a tensor ([B, T, H, dh] -> [B, H, T, dh] for per-head attention,
/// [T, B, D] -> [B, T, D] for batch-first data). transpose is the special case that swaps the
/// last two axes; split_heads/merge_heads also cut or join the feature axis.
///   X [d_0, ..., d_{r-1}] -> Y [d_{π(0)}, ..., d_{π(r-1)}]   (r <= 4; Settings{axes = π, rank = r})
///   Y[i_0, ..., i_{r-1}] = X[j]   with j_{π(k)} = i_k: output axis k is input axis π(k).
/// π must be a permutation of 0..r−1.
/// VJP: dX = permute(G, π⁻¹), π⁻¹(π(k)) = k. Each Y coordinate is one X coordinate, so
/// dX[j] = G[i] for the i with i_k = j_{π(k)}. permute(G, σ) reads G[i] at i_{σ(m)} = j_m; with
/// σ = π⁻¹ and m = π(k) that is i_k = j_{π(k)}, the same coordinate. (π itself in place of π⁻¹ is
/// right only when π is its own inverse, as a swap of two axes is; a cycle such as (1, 2, 0) is not.)
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace tapegrad {

/// Permute's axes as one settings field (autodiff/settings.hpp's proxies): the first `rank`
/// entries of its fixed array, saved and loaded as one list.
template <class Axes, class Rank>
struct AxesField {
    using field_proxy_of = Axes;
    Axes& axes;
    Rank& rank;

    std::vector<std::size_t> value() const { return {axes.begin(), axes.begin() + std::ptrdiff_t(rank)}; }
    void assign(const std::vector<std::size_t>& list, std::string_view name) const {
        if (list.size() > axes.size()) {
            throw usage_error(fmt::format("setting \"{}\" names {} axes, above the maximum rank {}", name, list.size(),
                                          axes.size()));
        }
        std::copy(list.begin(), list.end(), axes.begin());
        rank = list.size();
    }
};
template <class Axes, class Rank>
AxesField(Axes&, Rank&) -> AxesField<Axes, Rank>;

struct Permute {
    static constexpr std::string_view name = "permute";
    static constexpr Arity arity{1};

    /// Output axis k is input axis axes[k], for k < rank (the entries beyond rank are unused).
    struct Settings {
        std::array<std::size_t, max_rank> axes;
        std::size_t rank;
    };
    /// The axes, written as one list of `rank` entries.
    static constexpr auto fields(auto& s) { return std::tuple{field("axes", AxesField{s.axes, s.rank})}; }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return permute(in[0], std::span<const std::size_t>(s.axes.data(), s.rank));
    }

    static Settings inverse(const Settings& s) {
        Settings inv{{}, s.rank};
        for (std::size_t k = 0; k < s.rank; ++k) inv.axes[s.axes[k]] = k;
        return inv;
    }

    static Shape output_shape(const Shape& x, const Settings& s) {
        std::array<std::size_t, max_rank> dims{};
        for (std::size_t k = 0; k < s.rank; ++k) dims[k] = x[s.axes[k]];
        return Shape(std::span<const std::size_t>(dims.data(), s.rank));
    }

    /// Writes permute(x, s) into y, whose size is x's (it is not resized: forward sizes it, and a
    /// VJP writes into the gradient buffer the tape shaped like the input). The tensors are seen as
    /// rank 4 with leading axes of length 1, so four loops serve every rank.
    template <Scalar T>
    static void move_axes(const Tensor<T>& x, const Settings& s, Tensor<T>& y) {
        static_assert(max_rank == 4, "move_axes loops over four axes");
        const std::size_t pad = max_rank - s.rank;
        std::array<std::size_t, max_rank> x_dims{1, 1, 1, 1};
        for (std::size_t k = 0; k < s.rank; ++k) x_dims[pad + k] = x.shape()[k];
        std::array<std::size_t, max_rank> x_strides{};
        x_strides[max_rank - 1] = 1;
        for (std::size_t k = max_rank - 1; k-- > 0;) x_strides[k] = x_strides[k + 1] * x_dims[k + 1];
        // y's axis k walks x's axis `source`: its length and its stride in x.
        std::array<std::size_t, max_rank> y_dims{}, step{};
        for (std::size_t k = 0; k < max_rank; ++k) {
            const std::size_t source = k < pad ? k : pad + s.axes[k - pad];
            y_dims[k] = x_dims[source];
            step[k] = x_strides[source];
        }
        const T* from = x.data().data();
        T* to = y.data().data();
        for (std::size_t i0 = 0; i0 < y_dims[0]; ++i0)
            for (std::size_t i1 = 0; i1 < y_dims[1]; ++i1)
                for (std::size_t i2 = 0; i2 < y_dims[2]; ++i2) {
                    const T* row = from + i0 * step[0] + i1 * step[1] + i2 * step[2];
                    for (std::size_t i3 = 0; i3 < y_dims[3]; ++i3) *to++ = row[i3 * step[3]];
                }
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& X = *in[0];
        Y.resize(output_shape(X.shape(), s));
        move_axes(X, s, Y);
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        move_axes(at.G, inverse(s), dX);
    }
};

/// "1, 0, 2", for messages.
inline std::string axes_text(std::span<const std::size_t> axes) {
    std::string text;
    for (std::size_t k = 0; k < axes.size(); ++k) text += (k ? ", " : "") + std::to_string(axes[k]);
    return text;
}

/// X with its axes reordered: output axis k is X's axis axes[k]. shape_error when the number of
/// axes is not X's rank; value_error when `axes` is not a permutation of 0..rank−1.
template <Scalar T>
Var<T> permute(const Var<T>& X, std::span<const std::size_t> axes) {
    checks::non_empty(Permute::name, "X", X);
    const Shape& x = X.shape();
    if (axes.size() != x.rank()) {
        throw shape_error(fmt::format("permute: axes ({}) name {} axes but X has shape {} (rank {})",
                                      axes_text(axes), axes.size(), x.to_string(), x.rank()));
    }
    Permute::Settings s{{}, x.rank()};
    std::array<bool, max_rank> seen{};
    for (std::size_t k = 0; k < axes.size(); ++k) {
        if (axes[k] >= x.rank() || seen[axes[k]]) {
            throw value_error(fmt::format("permute: axes ({}) are not a permutation of 0..{} for X of shape {}",
                                          axes_text(axes), x.rank() - 1, x.to_string()));
        }
        seen[axes[k]] = true;
        s.axes[k] = axes[k];
    }
    return X.tape().template record<Permute>({X}, s);
}

template <Scalar T>
Var<T> permute(const Var<T>& X, std::initializer_list<std::size_t> axes) {
    return permute(X, std::span<const std::size_t>(axes.begin(), axes.size()));
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> permute<T>(const Var<T>&, std::span<const std::size_t>); \
    TAPEGRAD_INSTANCE Var<T> permute<T>(const Var<T>&, std::initializer_list<std::size_t>);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
