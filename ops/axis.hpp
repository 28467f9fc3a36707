/// \file
/// Helpers shared by the ops that work along one axis (the reductions sum_axis, mean, max and
/// logsumexp; slice and concat): the axis counted from the front, a tensor seen around an axis,
/// the shape with an axis removed, block copies along an axis, and the reductions' settings. One
/// place, so every such op refuses a bad axis with the same words and walks a tensor the same way.
#pragma once

#include "autodiff/error.hpp"
#include "autodiff/tape.hpp"
#include "autodiff/tensor.hpp"
#include "ops/checks.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <span>
#include <string_view>
#include <tuple>

namespace tapegrad::axes {

/// `axis` counted from the front: an axis in [−rank, rank) (negative counts from the back, as in
/// NumPy), or shape_error naming the op, the axis and the shape.
inline std::size_t from_front(std::string_view op, std::ptrdiff_t axis, const Shape& shape) {
    const auto rank = static_cast<std::ptrdiff_t>(shape.rank());
    if (rank == 0) {
        throw shape_error(fmt::format("{}: axis {} is out of range for shape {} (rank 0): a scalar has no axis", op,
                                      axis, shape.to_string()));
    }
    if (axis < -rank || axis >= rank) {
        throw shape_error(fmt::format("{}: axis {} is out of range for shape {} (rank {}); an axis is in [{}, {})", op,
                                      axis, shape.to_string(), rank, -rank, rank));
    }
    return static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
}

/// A row-major tensor seen around one axis: `outer` blocks (the product of the dimensions before
/// the axis), each `dim` positions long, each position `inner` contiguous values (the product of
/// the dimensions after it). A lane is one (outer, inner) pair: the `dim` values along the axis
/// that a reduction turns into one output, the output's flat index being o·inner + i.
struct View {
    std::size_t outer = 1, dim = 1, inner = 1;

    std::size_t lanes() const { return outer * inner; }
    /// Lane `lane` holds the values first(lane) + j·stride(), j in [0, dim).
    std::size_t stride() const { return inner; }
    std::size_t first(std::size_t lane) const { return lane / inner * dim * inner + lane % inner; }
};

inline View around(const Shape& shape, std::size_t axis) {
    View view{1, shape[axis], 1};
    for (std::size_t a = 0; a < axis; ++a) view.outer *= shape[a];
    for (std::size_t a = axis + 1; a < shape.rank(); ++a) view.inner *= shape[a];
    return view;
}

/// The shape with `axis` removed, or kept as a dimension of 1.
inline Shape without(const Shape& shape, std::size_t axis, bool keep_as_one) {
    std::array<std::size_t, max_rank> dims{};
    std::size_t rank = 0;
    for (std::size_t k = 0; k < shape.rank(); ++k) {
        if (k != axis) {
            dims[rank++] = shape[k];
        } else if (keep_as_one) {
            dims[rank++] = 1;
        }
    }
    return Shape(std::span<const std::size_t>(dims.data(), rank));
}

/// For each outer block, copies positions [from, from + length) of the source's axis to positions
/// [to, to + length) of the target's axis. Both views share `outer` and `inner`.
template <class T>
void copy_along(const T* source, const View& from_view, std::size_t from, T* target, const View& to_view,
                std::size_t to, std::size_t length) {
    const std::size_t inner = from_view.inner;
    for (std::size_t o = 0; o < from_view.outer; ++o) {
        std::copy_n(source + (o * from_view.dim + from) * inner, length * inner, target + (o * to_view.dim + to) * inner);
    }
}

}  // namespace tapegrad::axes

namespace tapegrad {

namespace reduction {

/// What every reduction along an axis records: the axis, already in [0, rank), and whether the
/// output keeps it as a dimension of size 1.
struct Settings {
    std::size_t axis = 0;
    bool keepdims = false;
};

/// The fields every reduction's settings have (autodiff/settings.hpp).
constexpr auto fields(auto& s) { return std::tuple{field("axis", s.axis), field("keepdims", s.keepdims)}; }

/// A recorded axis as the public functions take it (an int); one beyond int's range is out of range anyway.
inline int axis_argument(std::size_t axis) {
    return axis > std::size_t(std::numeric_limits<int>::max()) ? std::numeric_limits<int>::max() : int(axis);
}

/// The public functions' argument check: X non-empty and `axis` in [−rank, rank). Returns the
/// settings with the axis counted from the front.
template <Scalar T>
Settings checked(std::string_view op, const Var<T>& X, int axis_given, bool keepdims) {
    checks::non_empty(op, "X", X);
    return Settings{axes::from_front(op, axis_given, X.shape()), keepdims};
}

/// The output shape: the axis removed, or kept as 1.
inline Shape reduced_shape(const Shape& shape, const Settings& s) { return axes::without(shape, s.axis, s.keepdims); }

}  // namespace reduction

}  // namespace tapegrad
