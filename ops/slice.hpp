/// \file
/// slice: keeps the positions [begin, end) of one axis (the last n time steps, one head's columns,
/// the first rows of a batch).
///   X [..., d, ...] -> Y [..., end − begin, ...]   (d on axis `axis`; Settings{axis, begin, end})
///   Y[..., j, ...] = X[..., begin + j, ...]        for 0 <= j < end − begin
/// axis may count from the back (−1 is the last axis); 0 <= begin < end <= d.
/// VJP: G placed into zeros at [begin, end):
///   dX[..., p, ...] = G[..., p − begin, ...]   for begin <= p < end,   0 elsewhere.
/// Each Y coordinate is one X coordinate, so ∂Y[.., j, ..]/∂X[.., p, ..] = δ_{p, begin+j} (same
/// other indices) and dX[.., p, ..] = Σ_j G[.., j, ..] δ_{p, begin+j}; a position outside the
/// range reaches no output and gets no gradient.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/axis.hpp"
#include "ops/checks.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string_view>

namespace tapegrad {

struct Slice {
    static constexpr std::string_view name = "slice";
    static constexpr Arity arity{1};

    /// The axis (already counted from the front) and the range kept on it.
    struct Settings {
        std::size_t axis;
        std::size_t begin;
        std::size_t end;
    };
    static constexpr auto fields(auto& s) {
        return std::tuple{field("axis", s.axis), field("begin", s.begin), field("end", s.end)};
    }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return slice(in[0], std::ptrdiff_t(std::min<std::size_t>(s.axis, max_rank)), s.begin, s.end);
    }

    static Shape output_shape(const Shape& x, const Settings& s) {
        std::array<std::size_t, max_rank> dims{};
        std::copy(x.dims().begin(), x.dims().end(), dims.begin());
        dims[s.axis] = s.end - s.begin;
        return Shape(std::span<const std::size_t>(dims.data(), x.rank()));
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        const Tensor<T>& X = *in[0];
        Y.resize(output_shape(X.shape(), s));
        axes::copy_along(X.data().data(), axes::around(X.shape(), s.axis), s.begin, Y.data().data(), axes::around(Y.shape(), s.axis), 0,
                   s.end - s.begin);
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        dX.fill(T(0));
        axes::copy_along(at.G.data().data(), axes::around(at.G.shape(), s.axis), 0, dX.data().data(), axes::around(dX.shape(), s.axis),
                   s.begin, s.end - s.begin);
    }
};

/// Positions [begin, end) of X's axis `axis` (negative counts from the back).
/// shape_error when the axis does not exist or end exceeds its dimension; value_error when the
/// range is empty or reversed (begin >= end).
template <Scalar T>
Var<T> slice(const Var<T>& X, std::ptrdiff_t axis, std::size_t begin, std::size_t end) {
    checks::non_empty(Slice::name, "X", X);
    const Shape& x = X.shape();
    const std::size_t a = axes::from_front(Slice::name, axis, x);
    if (begin >= end) {
        throw value_error(fmt::format("slice: range [{}, {}) on axis {} of shape {} is empty or reversed; it needs "
                                      "begin < end",
                                      begin, end, axis, x.to_string()));
    }
    if (end > x[a]) {
        throw shape_error(fmt::format("slice: range [{}, {}) on axis {} exceeds its dimension {} (shape {})", begin,
                                      end, axis, x[a], x.to_string()));
    }
    return X.tape().template record<Slice>({X}, Slice::Settings{a, begin, end});
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> slice<T>(const Var<T>&, std::ptrdiff_t, std::size_t, std::size_t);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
