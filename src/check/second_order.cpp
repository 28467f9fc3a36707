// The JVP and HVP checks (check/second_order.hpp says what they compare and why), compiled once
// into the library. The header turns a user's graph into detail::SecondOrderGraphs, one function
// per tape type, so nothing here depends on the graph or on its number of leaves.
#include "check/second_order.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <random>
#include <string_view>

namespace tapegrad {

std::string SecondOrderReport::summary() const {
    std::string text = fmt::format(
        "{} check {} (seed {}, {} directions): {} of {} derivatives exceed the thresholds; max error "
        "50-digit dual tape vs 50-digit differences {:.3g}, double dual tape vs 50-digit differences {:.3g}, "
        "step agreement {:.3g}{}; {:.3f} s",
        check, passed ? "passed" : "FAILED", seed, directions, failures, compared, max_error_mp, max_error_double,
        max_step_disagreement, check == "jvp" ? fmt::format(", transpose identity {:.3g}", max_transpose_error) : std::string(),
        seconds);
    for (const SecondOrderMismatch& m : worst) {
        text += fmt::format("\n  {}: analytic ({}) = {:.17g}, numeric ({}) = {:.17g}, rel error {:.3g} > threshold {:.0e}",
                            m.where, m.analytic_label, m.analytic, m.numeric_label, m.numeric, m.rel_error, m.threshold);
    }
    return text;
}

namespace detail {
namespace {

// The leaves' values or a direction: one tensor per leaf.
using Parts = std::vector<Tensor<mp50>>;

// Records one comparison into the report; keeps the worst `keep` failures, one line per place
// (its worst disagreement over the steps and precisions).
void compare(SecondOrderReport& report, double& worst_of_kind, SecondOrderMismatch m, std::size_t keep) {
    ++report.compared;
    worst_of_kind = std::max(worst_of_kind, m.rel_error);
    if (m.rel_error <= m.threshold) return;  // written this way round so a NaN error fails
    report.passed = false;
    ++report.failures;
    keep_worst(report.worst, std::move(m), keep,
               [](const SecondOrderMismatch& a, const SecondOrderMismatch& b) { return a.where == b.where; });
}

template <Scalar To>
std::vector<Tensor<To>> cast_all(const Parts& x) {
    std::vector<Tensor<To>> y;
    for (const Tensor<mp50>& part : x) y.push_back(tensor_cast<To>(part));
    return y;
}

// x + s·v, leaf by leaf.
Parts moved(const Parts& x, const Parts& v, const mp50& s) {
    Parts y = x;
    for (std::size_t l = 0; l < y.size(); ++l)
        for (std::size_t k = 0; k < y[l].size(); ++k) y[l][k] += s * v[l][k];
    return y;
}

Parts random_direction(std::mt19937_64& generator, const Parts& x) {
    Parts v;
    for (const Tensor<mp50>& part : x) v.emplace_back(part.shape());
    random_unit_direction(generator, std::span<Tensor<mp50>>(v));
    return v;
}

// The central difference (f(x + h·v) − f(x − h·v)) / 2h entry by entry; an entry the move leaves
// unchanged (a hidden score, −inf on both sides) has difference 0.
Tensor<mp50> central(const Tensor<mp50>& plus, const Tensor<mp50>& minus, const mp50& h) {
    Tensor<mp50> d(plus.shape());
    for (std::size_t k = 0; k < d.size(); ++k) d[k] = plus[k] == minus[k] ? mp50(0) : mp50((plus[k] - minus[k]) / (2 * h));
    return d;
}

// Numeric derivatives at each step, and their agreement with each other.
void record_step_agreement(SecondOrderReport& report, const std::array<Tensor<mp50>, 2>& numeric) {
    for (std::size_t k = 0; k < numeric[0].size(); ++k)
        report.max_step_disagreement = std::max(report.max_step_disagreement, mixed_error(numeric[0][k], numeric[1][k]));
}

// The graph recorded on a new 50-digit tape at x; `vars` receive its leaves.
Var<mp50> record_mp(Tape<mp50>& tape, const GraphOn<mp50>& graph, const Parts& x, std::vector<Var<mp50>>& vars) {
    for (const Tensor<mp50>& part : x) vars.push_back(tape.leaf(part));
    return graph(vars);
}

Tensor<mp50> output_in_mp(const GraphOn<mp50>& graph, const Parts& x) {
    Tape<mp50> tape;
    std::vector<Var<mp50>> vars;
    return record_mp(tape, graph, x, vars).value();
}

// ⟨Jᵀ·u, t⟩ by the 50-digit tape's reverse mode, and u.
std::pair<mp50, Tensor<mp50>> reverse_along(const GraphOn<mp50>& graph, const Parts& x, const Parts& t,
                                            std::mt19937_64& generator) {
    Tape<mp50> tape;
    std::vector<Var<mp50>> vars;
    const Var<mp50> Y = record_mp(tape, graph, x, vars);
    Tensor<mp50> u(Y.shape());
    random_unit_direction(generator, std::span<Tensor<mp50>>(&u, 1));
    tape.backward(Y, u);
    mp50 inner(0);
    for (std::size_t l = 0; l < vars.size(); ++l)
        for (std::size_t k = 0; k < t[l].size(); ++k) inner += vars[l].grad()[k] * t[l][k];
    return {inner, u};
}

// ∇J at x in 50 digits, per leaf.
Parts gradient_in_mp(const GraphOn<mp50>& graph, const Parts& x) {
    Tape<mp50> tape;
    std::vector<Var<mp50>> vars;
    tape.backward(record_mp(tape, graph, x, vars));
    Parts g;
    for (const Var<mp50>& leaf : vars) g.push_back(leaf.grad());
    return g;
}

// J·t on a dual tape (autodiff/forward_mode.hpp, as jvp does it).
template <RealScalar T>
Tensor<T> jvp_tangent(const GraphOn<Dual<T>>& graph, const std::vector<Tensor<T>>& x, const std::vector<Tensor<T>>& t) {
    Tape<Dual<T>> tape;
    std::vector<Var<Dual<T>>> vars(x.size());
    const Var<Dual<T>> Y = record_dual(tape, graph, std::span<const Tensor<T>>(x), std::span<const Tensor<T>>(t), vars, "jvp");
    return tangents_of(Y.value());
}

// H·v on a dual tape, forward over reverse (as hvp does it).
template <RealScalar T>
std::vector<Tensor<T>> hvp_of(const GraphOn<Dual<T>>& graph, const std::vector<Tensor<T>>& x,
                              const std::vector<Tensor<T>>& v) {
    Tape<Dual<T>> tape;
    std::vector<Var<Dual<T>>> vars(x.size());
    const Var<Dual<T>> J = record_dual(tape, graph, std::span<const Tensor<T>>(x), std::span<const Tensor<T>>(v), vars, "hvp");
    std::vector<Tensor<T>> gradient(x.size()), Hv(x.size());
    gradient_and_hv(tape, J, vars, std::span<Tensor<T>>(gradient), std::span<Tensor<T>>(Hv));
    return Hv;
}

// The JVP check along one direction t.
void jvp_direction(SecondOrderReport& report, const SecondOrderGraphs& graph, const Parts& x, const Parts& t,
                   std::size_t direction, const CheckOptions& options, std::mt19937_64& generator) {
    const bool with_double = static_cast<bool>(graph.in_dual_double);
    const Tensor<mp50> mp = jvp_tangent(graph.in_dual_mp, x, t);
    Tensor<double> dbl;
    if (with_double) dbl = jvp_tangent(graph.in_dual_double, cast_all<double>(x), cast_all<double>(t));
    std::array<Tensor<mp50>, 2> numeric;
    for (std::size_t s = 0; s < 2; ++s) {
        const mp50 h(options.steps[s]);
        numeric[s] = central(output_in_mp(graph.in_mp, moved(x, t, h)), output_in_mp(graph.in_mp, moved(x, t, mp50(-h))), h);
    }
    record_step_agreement(report, numeric);
    for (std::size_t s = 0; s < 2; ++s) {
        const std::string numeric_label = fmt::format("50-digit central difference of Y along t, h={:g}", options.steps[s]);
        for (std::size_t k = 0; k < numeric[s].size(); ++k) {
            const std::string where = fmt::format("direction {}, output Y index {}", direction,
                                                  index_string(mp.shape(), k));
            const double n = to_double(numeric[s][k]);
            compare(report, report.max_error_mp,
                    {where, "JVP, 50-digit dual tape", numeric_label, to_double(mp[k]), n,
                     mixed_error(mp[k], numeric[s][k]), options.mp_tolerance},
                    options.max_reported);
            if (!with_double) continue;
            compare(report, report.max_error_double,
                    {where, "JVP, double dual tape", numeric_label, dbl[k], n, mixed_error(mp50(dbl[k]), numeric[s][k]),
                     options.double_tolerance},
                    options.max_reported);
        }
    }
    const auto [reverse, u] = reverse_along(graph.in_mp, x, t, generator);
    mp50 forward(0);
    for (std::size_t k = 0; k < u.size(); ++k) forward += u[k] * mp[k];
    compare(report, report.max_transpose_error,
            {fmt::format("direction {}, transpose identity", direction), "<u, J·t>, 50-digit dual tape",
             "<Jᵀ·u, t>, 50-digit reverse sweep", to_double(forward), to_double(reverse), mixed_error(forward, reverse),
             options.mp_tolerance},
            options.max_reported);
}

// The HVP check along one direction v.
void hvp_direction(SecondOrderReport& report, const SecondOrderGraphs& graph, std::span<const NamedTensor> leaves,
                   const Parts& x, const Parts& v, std::size_t direction, const CheckOptions& options) {
    const bool with_double = static_cast<bool>(graph.in_dual_double);
    const Parts mp = hvp_of(graph.in_dual_mp, x, v);
    std::vector<Tensor<double>> dbl;
    if (with_double) dbl = hvp_of(graph.in_dual_double, cast_all<double>(x), cast_all<double>(v));
    std::vector<std::array<Tensor<mp50>, 2>> numeric(x.size());
    for (std::size_t s = 0; s < 2; ++s) {
        const mp50 h(options.steps[s]);
        const Parts plus = gradient_in_mp(graph.in_mp, moved(x, v, h));
        const Parts minus = gradient_in_mp(graph.in_mp, moved(x, v, mp50(-h)));
        for (std::size_t l = 0; l < x.size(); ++l) numeric[l][s] = central(plus[l], minus[l], h);
    }
    for (std::size_t l = 0; l < x.size(); ++l) {
        record_step_agreement(report, numeric[l]);
        for (std::size_t s = 0; s < 2; ++s) {
            const std::string numeric_label =
                fmt::format("50-digit central difference of the 50-digit gradient along v, h={:g}", options.steps[s]);
            for (std::size_t k = 0; k < x[l].size(); ++k) {
                const std::string where = fmt::format("direction {}, leaf {} index {}", direction, leaves[l].name,
                                                      index_string(x[l].shape(), k));
                const mp50& n = numeric[l][s][k];
                compare(report, report.max_error_mp,
                        {where, "H·v, 50-digit dual tape", numeric_label, to_double(mp[l][k]), to_double(n),
                         mixed_error(mp[l][k], n), options.mp_tolerance},
                        options.max_reported);
                if (!with_double) continue;
                compare(report, report.max_error_double,
                        {where, "H·v, double dual tape", numeric_label, dbl[l][k], to_double(n),
                         mixed_error(mp50(dbl[l][k]), n), options.double_tolerance},
                        options.max_reported);
            }
        }
    }
}

// The directions, seeded, each checked by `check`, into one report.
template <class Check>
SecondOrderReport run(std::string_view name, std::span<const NamedTensor> leaves, const CheckOptions& options,
                      Check check) {
    const auto start = std::chrono::steady_clock::now();
    refuse_bad_leaves(leaves);
    SecondOrderReport report;
    report.check = name;
    report.seed = options.seed;
    report.directions = options.directions;
    Parts x;
    for (const NamedTensor& leaf : leaves) x.push_back(tensor_cast<mp50>(leaf.value));
    std::mt19937_64 generator(options.seed);
    for (std::size_t d = 1; d <= options.directions; ++d) check(report, x, random_direction(generator, x), d, generator);
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
}

}  // namespace

SecondOrderReport run_jvp_check(const SecondOrderGraphs& graph, std::span<const NamedTensor> leaves,
                                const CheckOptions& options) {
    return run("jvp", leaves, options,
               [&](SecondOrderReport& report, const Parts& x, const Parts& t, std::size_t d, std::mt19937_64& rng) {
                   jvp_direction(report, graph, x, t, d, options, rng);
               });
}

SecondOrderReport run_hvp_check(const SecondOrderGraphs& graph, std::span<const NamedTensor> leaves,
                                const CheckOptions& options) {
    return run("hvp", leaves, options,
               [&](SecondOrderReport& report, const Parts& x, const Parts& v, std::size_t d, std::mt19937_64&) {
                   hvp_direction(report, graph, leaves, x, v, d, options);
               });
}

}  // namespace detail
}  // namespace tapegrad
