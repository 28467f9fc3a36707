/// \file
/// Checks of forward mode and second order against 50-digit finite differences, in the gradient
/// checker's style (check/gradcheck.hpp): the same generic graph lambda, the same leaves, the same
/// steps and thresholds (CheckOptions, derived in check/report.hpp), reports that name where a
/// derivative was taken and label the analytic and numeric values.
///
///   check_jvp(graph, leaves)  for any output Y, along seeded random unit directions t over all leaves:
///     * J·t from a 50-digit dual tape  vs  (Y(x + h·t) − Y(x − h·t)) / 2h in 50 digits, per output
///       entry (mp_tolerance 1e-25), and J·t from a double dual tape against the same (double_tolerance);
///     * the transpose identity ⟨u, J·t⟩ = ⟨Jᵀ·u, t⟩ for a random u: forward mode against the tape's
///       reverse mode (backward seeded with u), both in 50 digits (mp_tolerance on the mixed error).
///   check_hvp(graph, leaves)  for a scalar J, along seeded random unit directions v:
///     * H·v from a 50-digit dual tape (forward over reverse)  vs  (∇J(x + h·v) − ∇J(x − h·v)) / 2h,
///       the 50-digit gradient's central difference, per leaf coordinate; H·v in double likewise.
///
/// Thresholds, as for the gradient (check/report.hpp): a central difference of a function f along a
/// unit direction has truncation error h²|f'''|/6 and rounding ε|f|/h, ε ≈ 5e-51. Here f is Y (for
/// the JVP) or ∇J (for the HVP, so f''' is a fourth derivative of J): at h = 1e-14 the error is at
/// most 1.7e-29·|f'''| + 5e-37·|f|, at h = 1e-16 1.7e-33·|f'''| + 5e-35·|f|, decades below 1e-25 for
/// |f'''| ≤ 1e3 and |f| ≤ 1e9; the two steps must also agree with each other (convergence). A dual
/// tape's rounding is that of a real tape (each tangent is a short sum of products of rounded
/// numbers), so the 50-digit side carries ~1e-48 and the double side the gradient's n·u·κ ≤ 1e-10.
/// A second-order error (a saved value not differentiated through, a wrong tangent rule) misses by
/// the size of the dropped term, O(1) here. Points at kinks are not second-order checked: check ops
/// on inputs away from them, as for the gradient.
/// Like the gradient checker, the checks are compiled once, in the library (src/check/second_order.cpp);
/// their report (SecondOrderReport) is in check/report.hpp.
#pragma once

#include "autodiff/forward_mode.hpp"
#include "check/gradcheck.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tapegrad {

namespace detail {

/// The graph as the compiled checks call it (src/check/second_order.cpp): one function per tape
/// type, as for the gradient checker (detail::GraphOnTapes).
struct SecondOrderGraphs {
    GraphOn<mp50> in_mp;
    GraphOn<Dual<mp50>> in_dual_mp;
    GraphOn<Dual<double>> in_dual_double;  ///< empty for DualTapes::mp_only
};

template <DualTapes tapes, std::size_t N, class Graph>
SecondOrderGraphs second_order_graphs(Graph& graph) {
    SecondOrderGraphs graphs{graph_on<N, mp50>(graph), graph_on<N, Dual<mp50>>(graph), {}};
    if constexpr (tapes == DualTapes::mp_and_double) graphs.in_dual_double = graph_on<N, Dual<double>>(graph);
    return graphs;
}

SecondOrderReport run_jvp_check(const SecondOrderGraphs& graph, std::span<const NamedTensor> leaves,
                                const CheckOptions& options);
SecondOrderReport run_hvp_check(const SecondOrderGraphs& graph, std::span<const NamedTensor> leaves,
                                const CheckOptions& options);

}  // namespace detail

/// Checks the JVP of `graph` (any output shape) and the transpose identity; see the top of this file.
template <DualTapes tapes = DualTapes::mp_and_double, std::size_t N, class Graph>
SecondOrderReport check_jvp(Graph&& graph, const NamedTensor (&leaves)[N], const CheckOptions& options = {}) {
    return detail::run_jvp_check(detail::second_order_graphs<tapes, N>(graph), leaves, options);
}

/// Checks the Hessian-vector products of `graph` (a scalar J); see the top of this file.
template <DualTapes tapes = DualTapes::mp_and_double, std::size_t N, class Graph>
SecondOrderReport check_hvp(Graph&& graph, const NamedTensor (&leaves)[N], const CheckOptions& options = {}) {
    return detail::run_hvp_check(detail::second_order_graphs<tapes, N>(graph), leaves, options);
}

}  // namespace tapegrad
