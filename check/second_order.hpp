// Checks of forward mode and second order against 50-digit finite differences, in the gradient
// checker's style (check/gradcheck.hpp): the same generic graph lambda, the same leaves, the same
// steps and thresholds (CheckOptions, derived in check/report.hpp), reports that name where a
// derivative was taken and label the analytic and numeric values.
//
//   check_jvp(graph, leaves)  for any output Y, along seeded random unit directions t over all leaves:
//     * J·t from a 50-digit dual tape  vs  (Y(x + h·t) − Y(x − h·t)) / 2h in 50 digits, per output
//       entry (mp_tolerance 1e-25), and J·t from a double dual tape against the same (double_tolerance);
//     * the transpose identity ⟨u, J·t⟩ = ⟨Jᵀ·u, t⟩ for a random u: forward mode against the tape's
//       reverse mode (backward seeded with u), both in 50 digits (mp_tolerance on the mixed error).
//   check_hvp(graph, leaves)  for a scalar J, along seeded random unit directions v:
//     * H·v from a 50-digit dual tape (forward over reverse)  vs  (∇J(x + h·v) − ∇J(x − h·v)) / 2h,
//       the 50-digit gradient's central difference, per leaf coordinate; H·v in double likewise.
//
// Thresholds, as for the gradient (check/report.hpp): a central difference of a function f along a
// unit direction has truncation error h²|f'''|/6 and rounding ε|f|/h, ε ≈ 5e-51. Here f is Y (for
// the JVP) or ∇J (for the HVP, so f''' is a fourth derivative of J): at h = 1e-14 the error is at
// most 1.7e-29·|f'''| + 5e-37·|f|, at h = 1e-16 1.7e-33·|f'''| + 5e-35·|f|, decades below 1e-25 for
// |f'''| ≤ 1e3 and |f| ≤ 1e9; the two steps must also agree with each other (convergence). A dual
// tape's rounding is that of a real tape (each tangent is a short sum of products of rounded
// numbers), so the 50-digit side carries ~1e-48 and the double side the gradient's n·u·κ ≤ 1e-10.
// A second-order error (a saved value not differentiated through, a wrong tangent rule) misses by
// the size of the dropped term, O(1) here. Points at kinks are not second-order checked: check ops
// on inputs away from them, as for the gradient.
#pragma once

#include "autodiff/forward_mode.hpp"
#include "check/gradcheck.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

namespace tapegrad {

// One derivative whose analytic and numeric values disagree.
struct SecondOrderMismatch {
    std::string where;     // "direction 1, output Y index (0, 2)", "direction 1, leaf W index (1, 0)"
    std::string analytic_label;  // "JVP, 50-digit dual tape"
    std::string numeric_label;   // "50-digit central difference of Y along t, h=1e-14"
    double analytic = 0;
    double numeric = 0;
    double rel_error = 0;  // |a − n| / max(1, |n|)
    double threshold = 0;
};

struct SecondOrderReport {
    std::string check;  // "jvp" or "hvp"
    bool passed = true;
    std::uint64_t seed = 0;
    std::size_t directions = 0;
    std::size_t compared = 0;  // derivatives compared (entries of J·t or H·v, per direction and precision)
    std::size_t failures = 0;
    double max_error_mp = 0;      // 50-digit dual tape vs 50-digit differences
    double max_error_double = 0;  // double dual tape vs 50-digit differences (0 when not run)
    double max_step_disagreement = 0;
    double max_transpose_error = 0;  // ⟨u, J·t⟩ vs ⟨Jᵀ·u, t⟩ (jvp only)
    std::vector<SecondOrderMismatch> worst;
    double seconds = 0;

    std::string summary() const {
        std::string text = fmt::format(
            "{} check {} (seed {}, {} directions): {} of {} derivatives exceed the thresholds; max error "
            "50-digit dual tape vs 50-digit differences {:.3g}, double dual tape vs 50-digit differences {:.3g}, "
            "step agreement {:.3g}{}; {:.3f} s",
            check, passed ? "passed" : "FAILED", seed, directions, failures, compared, max_error_mp, max_error_double,
            max_step_disagreement,
            check == "jvp" ? fmt::format(", transpose identity {:.3g}", max_transpose_error) : std::string(),
            seconds);
        for (const SecondOrderMismatch& m : worst) {
            text += fmt::format("\n  {}: analytic ({}) = {:.17g}, numeric ({}) = {:.17g}, rel error {:.3g} > threshold {:.0e}",
                                m.where, m.analytic_label, m.analytic, m.numeric_label, m.numeric, m.rel_error,
                                m.threshold);
        }
        return text;
    }
};

// Which dual tapes a check compares with the differences: the 50-digit one always; the double one
// too unless told otherwise (the op tables skip it: each precision instantiates every op of the
// graph once more, and the compile time of the tables is what that costs).
enum class DualTapes { mp_and_double, mp_only };

namespace second_order_detail {

using detail::mixed_error;

// Records one comparison into the report; keeps the worst `keep` failures, one line per place
// (its worst disagreement over the steps and precisions).
inline void compare(SecondOrderReport& report, double& worst_of_kind, SecondOrderMismatch m, std::size_t keep) {
    ++report.compared;
    worst_of_kind = std::max(worst_of_kind, m.rel_error);
    if (m.rel_error <= m.threshold) return;  // written this way round so a NaN error fails
    report.passed = false;
    ++report.failures;
    const auto same = std::find_if(report.worst.begin(), report.worst.end(),
                                   [&](const SecondOrderMismatch& w) { return w.where == m.where; });
    if (same != report.worst.end()) {
        if (same->rel_error >= m.rel_error) return;
        report.worst.erase(same);
    }
    report.worst.push_back(std::move(m));
    std::sort(report.worst.begin(), report.worst.end(),
              [](const SecondOrderMismatch& a, const SecondOrderMismatch& b) { return a.rel_error > b.rel_error; });
    if (report.worst.size() > keep) report.worst.pop_back();
}

template <std::size_t N>
std::array<Tensor<mp50>, N> leaves_in_mp(const NamedTensor (&leaves)[N]) {
    std::array<Tensor<mp50>, N> x;
    for (std::size_t l = 0; l < N; ++l) x[l] = tensor_cast<mp50>(leaves[l].value);
    return x;
}

template <Scalar To, std::size_t N>
std::array<Tensor<To>, N> cast_all(const std::array<Tensor<mp50>, N>& x) {
    std::array<Tensor<To>, N> y;
    for (std::size_t l = 0; l < N; ++l) y[l] = tensor_cast<To>(x[l]);
    return y;
}

// x + s·v, leaf by leaf.
template <std::size_t N>
std::array<Tensor<mp50>, N> moved(const std::array<Tensor<mp50>, N>& x, const std::array<Tensor<mp50>, N>& v,
                                  const mp50& s) {
    std::array<Tensor<mp50>, N> y = x;
    for (std::size_t l = 0; l < N; ++l)
        for (std::size_t k = 0; k < y[l].size(); ++k) y[l][k] += s * v[l][k];
    return y;
}

template <std::size_t N>
std::array<Tensor<mp50>, N> random_direction(std::mt19937_64& generator, const std::array<Tensor<mp50>, N>& x) {
    std::array<Tensor<mp50>, N> v;
    for (std::size_t l = 0; l < N; ++l) v[l] = Tensor<mp50>(x[l].shape());
    detail::random_unit_direction(generator, std::span<Tensor<mp50>>(v));
    return v;
}

// The central difference (f(x + h·v) − f(x − h·v)) / 2h entry by entry; an entry the move leaves
// unchanged (a hidden score, −inf on both sides) has difference 0.
inline Tensor<mp50> central(const Tensor<mp50>& plus, const Tensor<mp50>& minus, const mp50& h) {
    Tensor<mp50> d(plus.shape());
    for (std::size_t k = 0; k < d.size(); ++k) d[k] = plus[k] == minus[k] ? mp50(0) : mp50((plus[k] - minus[k]) / (2 * h));
    return d;
}

// Numeric derivatives at each step, and their agreement with each other.
inline void record_step_agreement(SecondOrderReport& report, const std::array<Tensor<mp50>, 2>& numeric) {
    for (std::size_t k = 0; k < numeric[0].size(); ++k)
        report.max_step_disagreement = std::max(report.max_step_disagreement, mixed_error(numeric[0][k], numeric[1][k]));
}

template <std::size_t N, class Graph>
Tensor<mp50> output_in_mp(Graph& graph, const std::array<Tensor<mp50>, N>& x) {
    Tape<mp50> tape;
    std::array<Var<mp50>, N> vars;
    for (std::size_t l = 0; l < N; ++l) vars[l] = tape.leaf(x[l]);
    return graph(vars).value();
}

// ⟨Jᵀ·u, t⟩ by the 50-digit tape's reverse mode, and u.
template <std::size_t N, class Graph>
std::pair<mp50, Tensor<mp50>> reverse_along(Graph& graph, const std::array<Tensor<mp50>, N>& x,
                                            const std::array<Tensor<mp50>, N>& t, std::mt19937_64& generator) {
    Tape<mp50> tape;
    std::array<Var<mp50>, N> vars;
    for (std::size_t l = 0; l < N; ++l) vars[l] = tape.leaf(x[l]);
    const Var<mp50> Y = graph(vars);
    Tensor<mp50> u(Y.shape());
    detail::random_unit_direction(generator, std::span<Tensor<mp50>>(&u, 1));
    tape.backward(Y, u);
    mp50 inner(0);
    for (std::size_t l = 0; l < N; ++l)
        for (std::size_t k = 0; k < t[l].size(); ++k) inner += vars[l].grad()[k] * t[l][k];
    return {inner, u};
}

// The JVP check along one direction t.
template <DualTapes tapes, std::size_t N, class Graph>
void jvp_direction(SecondOrderReport& report, Graph& graph, const std::array<Tensor<mp50>, N>& x,
                   const std::array<Tensor<mp50>, N>& t, std::size_t direction, const CheckOptions& options,
                   std::mt19937_64& generator) {
    const JvpResult<mp50> mp = jvp(graph, x, t);
    JvpResult<double> dbl;
    if constexpr (tapes == DualTapes::mp_and_double) dbl = jvp(graph, cast_all<double>(x), cast_all<double>(t));
    std::array<Tensor<mp50>, 2> numeric;
    for (std::size_t s = 0; s < 2; ++s) {
        const mp50 h(options.steps[s]);
        numeric[s] = central(output_in_mp(graph, moved(x, t, h)), output_in_mp(graph, moved(x, t, mp50(-h))), h);
    }
    record_step_agreement(report, numeric);
    for (std::size_t s = 0; s < 2; ++s) {
        const std::string numeric_label = fmt::format("50-digit central difference of Y along t, h={:g}", options.steps[s]);
        for (std::size_t k = 0; k < numeric[s].size(); ++k) {
            const std::string where = fmt::format("direction {}, output Y index {}", direction,
                                                  index_string(mp.tangent.shape(), k));
            const double n = to_double(numeric[s][k]);
            compare(report, report.max_error_mp,
                    {where, "JVP, 50-digit dual tape", numeric_label, to_double(mp.tangent[k]), n,
                     mixed_error(mp.tangent[k], numeric[s][k]), options.mp_tolerance},
                    options.max_reported);
            if (tapes == DualTapes::mp_only) continue;
            compare(report, report.max_error_double,
                    {where, "JVP, double dual tape", numeric_label, dbl.tangent[k], n,
                     mixed_error(mp50(dbl.tangent[k]), numeric[s][k]), options.double_tolerance},
                    options.max_reported);
        }
    }
    const auto [reverse, u] = reverse_along(graph, x, t, generator);
    mp50 forward(0);
    for (std::size_t k = 0; k < u.size(); ++k) forward += u[k] * mp.tangent[k];
    compare(report, report.max_transpose_error,
            {fmt::format("direction {}, transpose identity", direction), "<u, J·t>, 50-digit dual tape",
             "<Jᵀ·u, t>, 50-digit reverse sweep", to_double(forward), to_double(reverse), mixed_error(forward, reverse),
             options.mp_tolerance},
            options.max_reported);
}

// ∇J at x in 50 digits, per leaf.
template <std::size_t N, class Graph>
std::array<Tensor<mp50>, N> gradient_in_mp(Graph& graph, const std::array<Tensor<mp50>, N>& x) {
    Tape<mp50> tape;
    std::array<Var<mp50>, N> vars;
    for (std::size_t l = 0; l < N; ++l) vars[l] = tape.leaf(x[l]);
    tape.backward(graph(vars));
    std::array<Tensor<mp50>, N> g;
    for (std::size_t l = 0; l < N; ++l) g[l] = vars[l].grad();
    return g;
}

// The HVP check along one direction v.
template <DualTapes tapes, std::size_t N, class Graph>
void hvp_direction(SecondOrderReport& report, Graph& graph, const NamedTensor (&leaves)[N],
                   const std::array<Tensor<mp50>, N>& x, const std::array<Tensor<mp50>, N>& v, std::size_t direction,
                   const CheckOptions& options) {
    const HvpResult<mp50, N> mp = hvp(graph, x, v);
    HvpResult<double, N> dbl{};
    if constexpr (tapes == DualTapes::mp_and_double) dbl = hvp(graph, cast_all<double>(x), cast_all<double>(v));
    std::array<std::array<Tensor<mp50>, 2>, N> numeric;
    for (std::size_t s = 0; s < 2; ++s) {
        const mp50 h(options.steps[s]);
        const std::array<Tensor<mp50>, N> plus = gradient_in_mp(graph, moved(x, v, h));
        const std::array<Tensor<mp50>, N> minus = gradient_in_mp(graph, moved(x, v, mp50(-h)));
        for (std::size_t l = 0; l < N; ++l) numeric[l][s] = central(plus[l], minus[l], h);
    }
    for (std::size_t l = 0; l < N; ++l) {
        record_step_agreement(report, numeric[l]);
        for (std::size_t s = 0; s < 2; ++s) {
            const std::string numeric_label =
                fmt::format("50-digit central difference of the 50-digit gradient along v, h={:g}", options.steps[s]);
            for (std::size_t k = 0; k < x[l].size(); ++k) {
                const std::string where = fmt::format("direction {}, leaf {} index {}", direction, leaves[l].name,
                                                      index_string(x[l].shape(), k));
                const mp50& n = numeric[l][s][k];
                compare(report, report.max_error_mp,
                        {where, "H·v, 50-digit dual tape", numeric_label, to_double(mp.Hv[l][k]), to_double(n),
                         mixed_error(mp.Hv[l][k], n), options.mp_tolerance},
                        options.max_reported);
                if (tapes == DualTapes::mp_only) continue;
                compare(report, report.max_error_double,
                        {where, "H·v, double dual tape", numeric_label, dbl.Hv[l][k], to_double(n),
                         mixed_error(mp50(dbl.Hv[l][k]), n), options.double_tolerance},
                        options.max_reported);
            }
        }
    }
}

template <std::size_t N, class Check>
SecondOrderReport run(std::string_view name, const NamedTensor (&leaves)[N], const CheckOptions& options, Check check) {
    const auto start = std::chrono::steady_clock::now();
    detail::refuse_bad_leaves(leaves);
    SecondOrderReport report;
    report.check = name;
    report.seed = options.seed;
    report.directions = options.directions;
    const std::array<Tensor<mp50>, N> x = leaves_in_mp(leaves);
    std::mt19937_64 generator(options.seed);
    for (std::size_t d = 1; d <= options.directions; ++d) check(report, x, random_direction(generator, x), d, generator);
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
}

}  // namespace second_order_detail

// Checks the JVP of `graph` (any output shape) and the transpose identity; see the top of this file.
template <DualTapes tapes = DualTapes::mp_and_double, std::size_t N, class Graph>
SecondOrderReport check_jvp(Graph&& graph, const NamedTensor (&leaves)[N], const CheckOptions& options = {}) {
    return second_order_detail::run(
        "jvp", leaves, options, [&](SecondOrderReport& report, const auto& x, const auto& t, std::size_t d, auto& rng) {
            second_order_detail::jvp_direction<tapes>(report, graph, x, t, d, options, rng);
        });
}

// Checks the Hessian-vector products of `graph` (a scalar J); see the top of this file.
template <DualTapes tapes = DualTapes::mp_and_double, std::size_t N, class Graph>
SecondOrderReport check_hvp(Graph&& graph, const NamedTensor (&leaves)[N], const CheckOptions& options = {}) {
    return second_order_detail::run(
        "hvp", leaves, options, [&](SecondOrderReport& report, const auto& x, const auto& v, std::size_t d, auto&) {
            second_order_detail::hvp_direction<tapes>(report, graph, leaves, x, v, d, options);
        });
}

}  // namespace tapegrad
