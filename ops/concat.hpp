/// \file
/// concat: joins tensors along one axis (a key-value cache grown by each new block of time steps,
/// heads' outputs side by side).
///   X_0 [..., n_0, ...], ..., X_{m-1} [..., n_{m-1}, ...] -> Y [..., n_0 + ... + n_{m-1}, ...]
///   Y[..., o_i + p, ...] = X_i[..., p, ...]   for 0 <= p < n_i,  where o_i = n_0 + ... + n_{i-1}
/// Every input has the same rank and the same dimensions except on `axis` (Settings{axis}); axis
/// may count from the back (−1 is the last axis).
/// VJP, for each input X_i: its slice of G,
///   dX_i[..., p, ...] = G[..., o_i + p, ...]
/// because each Y coordinate is exactly one coordinate of one input: ∂Y[.., o_i + p, ..]/∂X_i[.., q, ..]
/// = δ_pq (same other indices), and no Y coordinate outside [o_i, o_i + n_i) depends on X_i.
///
/// More inputs than a node may have: a tape node has at most `max_arity` (4) inputs, so concat of
/// more tensors records a tree of concat nodes of at most 4 inputs each (groups of 4 consecutive
/// inputs, then the groups' results, and so on; a group of one passes through unchanged). Concat is
/// associative along one axis, so the tree gives the same Y, and the chain rule through the tree
/// gives each input the same slice of G. So 5 inputs record 2 nodes (X_0..X_3 joined, then that and
/// X_4), 9 inputs 3 nodes, 17 inputs 6.
#pragma once

#include "autodiff/instances.hpp"
#include "ops/checks.hpp"
#include "ops/axis.hpp"
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

struct Concat {
    static constexpr std::string_view name = "concat";
    static constexpr Arity arity{1, max_arity};

    /// The axis, already counted from the front. The inputs' extents along it are their shapes.
    struct Settings {
        std::size_t axis;
    };
    static constexpr auto fields(auto& s) { return std::tuple{field("axis", s.axis)}; }
    template <Scalar T>
    static Var<T> record(const Settings& s, std::span<const Var<T>> in) {
        return concat(in, std::ptrdiff_t(std::min<std::size_t>(s.axis, max_rank)));
    }

    template <Scalar T>
    static void forward(const Settings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>&) {
        std::array<std::size_t, max_rank> dims{};
        const Shape& first = in[0]->shape();
        std::copy(first.dims().begin(), first.dims().end(), dims.begin());
        dims[s.axis] = 0;
        for (const Tensor<T>* x : in) dims[s.axis] += x->shape()[s.axis];
        Y.resize(Shape(std::span<const std::size_t>(dims.data(), first.rank())));
        const axes::View y_view = axes::around(Y.shape(), s.axis);
        std::size_t offset = 0;
        for (const Tensor<T>* x : in) {
            const std::size_t n = x->shape()[s.axis];
            axes::copy_along(x->data().data(), axes::around(x->shape(), s.axis), 0, Y.data().data(), y_view, offset,
                              n);
            offset += n;
        }
    }

    template <Scalar T>
    static void vjp(const Settings& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& dX) {
        std::size_t offset = 0;
        for (std::size_t j = 0; j < which; ++j) offset += at.in[j]->shape()[s.axis];
        axes::copy_along(at.G.data().data(), axes::around(at.G.shape(), s.axis), offset, dX.data().data(),
                          axes::around(dX.shape(), s.axis), 0, dX.shape()[s.axis]);
    }

    /// The axis counted from the front, after checking that the inputs can be joined along it.
    template <Scalar T>
    static std::size_t checked_axis(std::span<const Var<T>> parts, std::ptrdiff_t axis) {
        if (parts.empty()) throw usage_error("concat: no tensors to join (the list of inputs is empty)");
        for (std::size_t k = 0; k < parts.size(); ++k) {
            checks::non_empty(name, fmt::format("input {}", k), parts[k]);
            if (&parts[k].tape() != &parts[0].tape()) {
                throw usage_error(fmt::format("concat: input {} belongs to another tape than input 0", k));
            }
        }
        const Shape& first = parts[0].shape();
        const std::size_t a = axes::from_front(name, axis, first);
        for (std::size_t k = 1; k < parts.size(); ++k) {
            const Shape& other = parts[k].shape();
            bool fits = other.rank() == first.rank();
            for (std::size_t d = 0; fits && d < first.rank(); ++d) fits = d == a || other[d] == first[d];
            if (!fits) {
                throw shape_error(fmt::format(
                    "concat: input {} has shape {} and input 0 has shape {}; along axis {} the inputs need one rank "
                    "and the same dimensions except on that axis",
                    k, other.to_string(), first.to_string(), axis));
            }
        }
        return a;
    }

    /// One node joining 1 to max_arity inputs.
    template <Scalar T>
    static Var<T> record_node(std::span<const Var<T>> parts, std::size_t axis) {
        static_assert(max_arity == 4, "record_node spells out the input lists up to max_arity");
        Tape<T>& tape = parts[0].tape();
        const Settings s{axis};
        switch (parts.size()) {
            case 1: return tape.template record<Concat>({parts[0]}, s);
            case 2: return tape.template record<Concat>({parts[0], parts[1]}, s);
            case 3: return tape.template record<Concat>({parts[0], parts[1], parts[2]}, s);
            default: return tape.template record<Concat>({parts[0], parts[1], parts[2], parts[3]}, s);
        }
    }

    /// More than max_arity inputs: groups of max_arity consecutive inputs joined first, then the
    /// groups' results (see the header comment).
    template <Scalar T>
    static Var<T> record_tree(std::span<const Var<T>> parts, std::size_t axis) {
        if (parts.size() <= max_arity) return record_node(parts, axis);
        std::vector<Var<T>> groups;
        for (std::size_t first = 0; first < parts.size(); first += max_arity) {
            const std::span<const Var<T>> group = parts.subspan(first, std::min(max_arity, parts.size() - first));
            groups.push_back(group.size() == 1 ? group[0] : record_node(group, axis));
        }
        return record_tree(std::span<const Var<T>>(groups), axis);
    }
};

/// The inputs joined along `axis` (negative counts from the back), in order. usage_error for an
/// empty list or inputs from different tapes; shape_error for an axis the inputs do not have or
/// inputs that differ in rank or in a dimension other than `axis`.
template <Scalar T>
Var<T> concat(std::span<const Var<T>> parts, std::ptrdiff_t axis) {
    const std::size_t a = Concat::checked_axis(parts, axis);
    return Concat::record_tree(parts, a);
}

template <Scalar T>
Var<T> concat(std::initializer_list<Var<T>> parts, std::ptrdiff_t axis) {
    return concat(std::span<const Var<T>>(parts.begin(), parts.size()), axis);
}

template <Scalar T>
Var<T> concat(const std::vector<Var<T>>& parts, std::ptrdiff_t axis) {
    return concat(std::span<const Var<T>>(parts), axis);
}

// Compiled once in the library for float, double, mp50 and duals (autodiff/instances.hpp).
#define TAPEGRAD_OP_INSTANCES(T) TAPEGRAD_INSTANCE Var<T> concat<T>(std::span<const Var<T>>, std::ptrdiff_t); \
    TAPEGRAD_INSTANCE Var<T> concat<T>(std::initializer_list<Var<T>>, std::ptrdiff_t); \
    TAPEGRAD_INSTANCE Var<T> concat<T>(const std::vector<Var<T>>&, std::ptrdiff_t);
TAPEGRAD_FOR_LIBRARY_SCALARS(TAPEGRAD_OP_INSTANCES)
#undef TAPEGRAD_OP_INSTANCES

}  // namespace tapegrad
