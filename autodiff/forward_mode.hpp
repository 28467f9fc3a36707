/// \file
/// Forward mode and second order, on the tape as it is: a graph recorded on a Tape<Dual<T>>
/// (autodiff/dual.hpp) carries each value's derivative along the leaves' tangents.
///
///   jvp(graph, leaves, tangents)  the output Y and its directional derivative J_Y·t, in one forward
///                                 pass (no backward).
///   hvp(graph, leaves, v)         for a scalar J: its gradient and H·v, forward over reverse. The
///                                 leaves' tangents are v; the reverse sweep on the dual tape runs
///                                 every op's VJP in dual numbers, so each gradient's tangent is
///                                 d/dε ∇J(x + εv) = H·v. One forward and one backward, each about
///                                 three times the real work of a product (value, two tangent terms).
///   hessian(graph, leaves)        the full Hessian, column c = H·e_c, for small graphs.
///
/// The graph is the generic lambda the checker takes (check/gradcheck.hpp): a function of an
/// array of Vars returning a Var. It is instantiated for Var<Dual<T>>; every op's forward and VJP is
/// generic code in the scalar type, so no op needs a forward rule of its own.
#pragma once

#include "autodiff/dual.hpp"
#include "autodiff/error.hpp"
#include "autodiff/tape.hpp"

#include <fmt/core.h>

#include <array>
#include <cstddef>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace tapegrad {

/// x = value + tangent·ε (same shapes), written into `x` (its buffer is reused when large enough).
template <RealScalar T>
void dual_tensor_into(const Tensor<T>& value, const Tensor<T>& tangent, Tensor<Dual<T>>& x) {
    if (!(value.shape() == tangent.shape())) {
        throw shape_error(fmt::format("dual_tensor: tangent of shape {} for a value of shape {}",
                                      tangent.shape().to_string(), value.shape().to_string()));
    }
    x.resize(value.shape());
    for (std::size_t k = 0; k < x.size(); ++k) x[k] = Dual<T>(value[k], tangent[k]);
}

template <RealScalar T>
Tensor<Dual<T>> dual_tensor(const Tensor<T>& value, const Tensor<T>& tangent) {
    Tensor<Dual<T>> x;
    dual_tensor_into(value, tangent, x);
    return x;
}

/// The value and tangent planes of a dual tensor, written into `values` and `tangents`.
template <RealScalar T>
void split_planes(const Tensor<Dual<T>>& x, Tensor<T>& values, Tensor<T>& tangents) {
    values.resize(x.shape());
    tangents.resize(x.shape());
    for (std::size_t k = 0; k < x.size(); ++k) {
        values[k] = x[k].value();
        tangents[k] = x[k].tangent();
    }
}

template <RealScalar T>
Tensor<T> tangents_of(const Tensor<Dual<T>>& x) {
    Tensor<T> v, t;
    split_planes(x, v, t);
    return t;
}

template <RealScalar T>
struct JvpResult {
    Tensor<T> value;    ///< Y
    Tensor<T> tangent;  ///< J_Y·t: the derivative of Y along the leaves' tangents
};

template <RealScalar T, std::size_t N>
struct HvpResult {
    T value;                          ///< J
    std::array<Tensor<T>, N> gradient;  ///< ∇J, per leaf
    std::array<Tensor<T>, N> Hv;        ///< H·v, per leaf
};

namespace detail {

/// Records `graph` on `tape` (cleared first; its buffers are reused) with leaves value + tangent·ε,
/// held in `vars` (an array of N Vars, or a vector of as many as there are leaves): returns
/// graph(vars). Each leaf is built in a per-thread scratch tensor and copied into its node's reused
/// buffer, so a warm tape records without allocating (a fresh tensor per leaf and call costs page
/// faults).
template <RealScalar T, class Leaves, class Graph>
Var<Dual<T>> record_dual(Tape<Dual<T>>& tape, Graph& graph, std::span<const Tensor<T>> leaves,
                         std::span<const Tensor<T>> tangents, Leaves& vars, std::string_view what) {
    tape.clear();
    thread_local Tensor<Dual<T>> scratch;
    for (std::size_t l = 0; l < leaves.size(); ++l) {
        if (!(tangents[l].shape() == leaves[l].shape())) {
            throw shape_error(fmt::format("{}: direction for leaf {} has shape {}, the leaf has shape {}", what, l,
                                          tangents[l].shape().to_string(), leaves[l].shape().to_string()));
        }
        dual_tensor_into(leaves[l], tangents[l], scratch);
        vars[l] = tape.leaf(scratch, fmt::format("x{}", l));
    }
    return graph(vars);
}

/// The reverse sweep of a scalar J recorded on a dual tape whose leaves' tangents are v: each
/// leaf's gradient into gradient[l] and its tangent, H·v, into Hv[l]. Returns J.
template <RealScalar T, class Leaves>
T gradient_and_hv(Tape<Dual<T>>& tape, const Var<Dual<T>>& J, const Leaves& vars, std::span<Tensor<T>> gradient,
                  std::span<Tensor<T>> Hv) {
    if (J.shape().size() != 1) {
        throw usage_error(fmt::format("hvp: the graph must return a scalar J, it returned shape {}",
                                      J.shape().to_string()));
    }
    tape.backward(J);  // seed 1 + 0ε: the tangents of the gradients are H·v
    for (std::size_t l = 0; l < gradient.size(); ++l) split_planes(vars[l].grad(), gradient[l], Hv[l]);
    return J.value()[0].value();
}

}  // namespace detail

/// Y = graph(leaves) and its directional derivative along `tangents`, on a reusable tape, into
/// `result` (its buffers are reused).
template <RealScalar T, std::size_t N, class Graph>
void jvp(Tape<Dual<T>>& tape, Graph&& graph, const std::array<Tensor<T>, N>& leaves,
         const std::array<Tensor<T>, N>& tangents, JvpResult<T>& result) {
    std::array<Var<Dual<T>>, N> vars;
    const Var<Dual<T>> Y =
        detail::record_dual(tape, graph, std::span<const Tensor<T>>(leaves), std::span<const Tensor<T>>(tangents), vars, "jvp");
    split_planes(Y.value(), result.value, result.tangent);
}

template <RealScalar T, std::size_t N, class Graph>
JvpResult<T> jvp(Tape<Dual<T>>& tape, Graph&& graph, const std::array<Tensor<T>, N>& leaves,
                 const std::array<Tensor<T>, N>& tangents) {
    JvpResult<T> result;
    jvp(tape, graph, leaves, tangents, result);
    return result;
}

template <RealScalar T, std::size_t N, class Graph>
JvpResult<T> jvp(Graph&& graph, const std::array<Tensor<T>, N>& leaves, const std::array<Tensor<T>, N>& tangents) {
    Tape<Dual<T>> tape;
    return jvp(tape, graph, leaves, tangents);
}

/// J = graph(leaves) (one element), its gradient and H·v, on a reusable tape, into `result`.
template <RealScalar T, std::size_t N, class Graph>
void hvp(Tape<Dual<T>>& tape, Graph&& graph, const std::array<Tensor<T>, N>& leaves,
         const std::array<Tensor<T>, N>& v, HvpResult<T, N>& result) {
    std::array<Var<Dual<T>>, N> vars;
    const Var<Dual<T>> J =
        detail::record_dual(tape, graph, std::span<const Tensor<T>>(leaves), std::span<const Tensor<T>>(v), vars, "hvp");
    result.value = detail::gradient_and_hv(tape, J, vars, std::span<Tensor<T>>(result.gradient), std::span<Tensor<T>>(result.Hv));
}

template <RealScalar T, std::size_t N, class Graph>
HvpResult<T, N> hvp(Tape<Dual<T>>& tape, Graph&& graph, const std::array<Tensor<T>, N>& leaves,
                    const std::array<Tensor<T>, N>& v) {
    HvpResult<T, N> result{};
    hvp(tape, graph, leaves, v, result);
    return result;
}

template <RealScalar T, std::size_t N, class Graph>
HvpResult<T, N> hvp(Graph&& graph, const std::array<Tensor<T>, N>& leaves, const std::array<Tensor<T>, N>& v) {
    Tape<Dual<T>> tape;
    return hvp(tape, graph, leaves, v);
}

/// The Hessian of J over all leaves' coordinates, flattened leaf after leaf (n = Σ sizes): an n×n
/// matrix whose column c is H·e_c. n HVPs: for small graphs (a check, a curvature picture).
/// Symmetric to rounding; it is not symmetrised, so its asymmetry shows the rounding.
template <RealScalar T, std::size_t N, class Graph>
Tensor<T> hessian(Graph&& graph, const std::array<Tensor<T>, N>& leaves) {
    std::size_t n = 0;
    for (const Tensor<T>& x : leaves) n += x.size();
    Tensor<T> H(Shape{n, n});
    std::array<Tensor<T>, N> e;
    for (std::size_t l = 0; l < N; ++l) e[l] = Tensor<T>(leaves[l].shape());
    Tape<Dual<T>> tape;
    HvpResult<T, N> r{};
    std::size_t column = 0;
    for (std::size_t l = 0; l < N; ++l) {
        for (std::size_t c = 0; c < leaves[l].size(); ++c, ++column) {
            e[l][c] = T(1);
            hvp(tape, graph, leaves, e, r);
            e[l][c] = T(0);
            std::size_t row = 0;
            for (const Tensor<T>& part : r.Hv)
                for (std::size_t k = 0; k < part.size(); ++k) H(row++, column) = part[k];
        }
    }
    return H;
}

}  // namespace tapegrad
