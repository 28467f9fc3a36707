/// \file
/// Certified gradients: for every gradient element of a graph, an interval that provably holds the
/// exact derivative, and one that provably holds what the hand-written VJPs give, with no step and no
/// tolerance (issue 50). The graph is the checker's generic lambda (check/gradcheck.hpp), or a tape
/// that ordinary code recorded, as the recorded check takes it (check/recorded.hpp):
///
///     CertificationReport report = certify_gradients(graph, {{"X", X}, {"W", W}});
///     report.summary();   // "certified 24 of 24 derivatives: |VJP − derivative| ≤ 3.1e-48 ..."
///     CertificationReport same = certify_gradients(tape, J);   // a Tape<double> or Tape<float>
///     CertificationReport second = certify_hvp(graph, {{"X", X}, {"W", W}}, {v_X, v_W});   // H·v
///
/// How. Interval arithmetic at 50 digits (autodiff/interval.hpp) encloses the exact real result of
/// the same code. (1) The graph recorded on a Tape<Interval> from the leaves as point intervals, and
/// its backward run: each gradient element is an interval V that contains what the VJP formulas give
/// in exact arithmetic. (2) For each leaf element, the graph recorded on a Tape<Dual<Interval>> with
/// that element's tangent 1 and every other 0 (forward mode, one tangent at a time, so every element
/// is proven on its own): J's tangent is an interval D that contains the exact partial derivative of
/// the function the forward code computes. The verdict per element:
///   * certified: D and V overlap, so the exact VJP value and the exact derivative differ by at most
///     the width of D ∪ V (2e-49 on the spec-shaped attention at 50 digits): a proven bound, `bound`;
///   * wrong: D and V are disjoint, so the VJP is wrong with certainty, by at least the gap, `bound`;
///   * undecided: a comparison on intervals that overlap (autodiff/interval.hpp) was met in the
///     forward pass of that element or in the backward pass: a branch at a point where the function
///     may have no derivative (relu or abs at 0, a max with a tie, a clamp at its bound). It is named
///     (node, op, forward or VJP, the two intervals) and neither certified nor called wrong.
/// (3) Branch by branch, as the checker attributes a summed gradient: for a leaf that feeds several
/// ops (X feeding Q, K and V), each consumer's VJP contribution (the backward run logs them) against
/// ∂J/∂x along that edge alone, the forward code recomputed downstream of the leaf with the tangent
/// given to that edge only (derivative_along_edge below); the same verdicts, in `branches`, each
/// element naming its consumer ("matmul -> node 5 (input 0)"). Errors that cancel in the sum are
/// found there.
///     Only comparisons inside the tape's ops count: the public functions' argument checks (a
///     dropout mask of 0 and 1) choose no branch; a graph that branches on values between ops, in
///     its own code, is certified for the branch it took.
/// What is proven is about the function the code computes in exact arithmetic (double constants in
/// the code are taken as the doubles they are), not about float rounding: that is the precision
/// audit's job (check/audit.hpp). The cost is one interval backward and one interval forward pass
/// per leaf element, each operation a 50-digit MPFI one: meant for the graphs a test checks. The
/// forward passes repeat the same values (only the tangents differ), so the exponentials and their
/// kin are computed once and remembered (autodiff/interval.hpp): the walkthrough's 16 elements
/// certify in about half the time of their 50-digit check (benchmarks/bench_certify.cpp).
/// Certifications take turns in a process (they share the interval ambiguity log).
/// Include this header only where you certify, and link tapegrad::certify (its static library, with
/// the interval siblings of every library op and the recorded tape's certification, and MPFI, MPFR,
/// GMP).
#pragma once

#include "autodiff/interval.hpp"
#include "autodiff/interval_rerun.hpp"
#include "check/gradcheck.hpp"

#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace tapegrad {

enum class Certified { certified, wrong, undecided };

/// One gradient element: the enclosures and the verdict.
struct CertifiedDerivative {
    std::string leaf;
    std::size_t index = 0;  ///< flat, row-major
    Interval derivative;    ///< contains the exact ∂J/∂x (forward mode)
    Interval vjp;           ///< contains the exact value of the VJPs' formulas
    Certified verdict = Certified::undecided;
    double bound = 0;  ///< certified: |VJP − derivative| ≤ bound; wrong: they differ by at least bound (rounded outward)
    std::string kink;  ///< undecided: the first ambiguous comparison, named
    /// For one branch of a leaf that feeds several ops: the consumer, "matmul -> node 5 (input 0)"
    /// (as the checker names it); empty for the leaf's whole gradient.
    std::string branch;
};

struct CertificationReport {
    std::vector<CertifiedDerivative> derivatives;  ///< every leaf element's whole gradient
    /// certify_gradients: each branch of a leaf that feeds several ops (X feeding Q, K and V),
    /// element by element: the consumer's VJP contribution against ∂J/∂x along that edge alone.
    std::vector<CertifiedDerivative> branches;
    std::size_t certified = 0, wrong = 0, undecided = 0;  ///< among `derivatives`
    std::size_t branches_certified = 0, branches_wrong = 0, branches_undecided = 0;
    double worst_bound = 0;  ///< the largest bound among the certified elements, branches included
    /// No element wrong, whole or branch (undecided elements, at kinks, neither pass nor fail, as
    /// the checker's kinks).
    bool passed() const { return wrong == 0 && branches_wrong == 0; }
    std::string summary() const;
};

/// How a certification runs: `progress`, when set, is called after each leaf element's forward
/// pass (stage "certification"; `done` of `all` elements, `mine` = `all`, `seconds` since the start),
/// then after each branch element's (stage "branch certification", counted apart), or each H·v
/// element's (stage "HVP certification"): the checker's CheckProgress, so a tool prints both the
/// same way.
struct CertifyOptions {
    std::function<void(const CheckProgress&)> progress;
};

namespace detail {

/// The first ambiguity of `log`, named with the node (its op from `tape`) and the pass.
template <class T>
std::string describe_ambiguity(const IntervalAmbiguityLog& log, const Tape<T>& tape, std::string_view pass) {
    const IntervalAmbiguity& a = log.first.front();  // made inside an op: its node is on `tape`
    return fmt::format("node {} ({}{}) in the {}: {} {} {} is ambiguous ({} ambiguous comparison{})", a.node,
                       tape.info(a.node).op, a.in_vjp ? " VJP" : "", pass, a.left, a.comparison, a.right, log.count,
                       log.count == 1 ? "" : "s");
}

/// Upper bound on |x| as a double (rounded up), for reports.
inline double double_above(const mpfr50& x) {
    const double d = x.convert_to<double>();
    return d < x ? std::nextafter(d, std::numeric_limits<double>::infinity()) : d;
}

/// The verdict of one element from its two enclosures.
inline void judge(CertifiedDerivative& d) {
    if (overlap(d.derivative, d.vjp)) {
        d.verdict = Certified::certified;
        const mpfr50 hi = upper(d.derivative) > upper(d.vjp) ? upper(d.derivative) : upper(d.vjp);
        const mpfr50 lo = lower(d.derivative) < lower(d.vjp) ? lower(d.derivative) : lower(d.vjp);
        d.bound = double_above(mpfr50(hi - lo));
    } else {
        d.verdict = Certified::wrong;
        const mpfr50 gap = lower(d.derivative) > upper(d.vjp) ? mpfr50(lower(d.derivative) - upper(d.vjp))
                                                               : mpfr50(lower(d.vjp) - upper(d.derivative));
        d.bound = std::max(0.0, gap.convert_to<double>() * (1 - 1e-15));  // rounded toward zero: "at least"
    }
}

/// The report's counts and worst bound, from its elements' verdicts.
inline void count_verdicts(CertificationReport& report) {
    const auto count = [&report](const std::vector<CertifiedDerivative>& elements, std::size_t& certified,
                                 std::size_t& wrong, std::size_t& undecided) {
        for (const CertifiedDerivative& d : elements) {
            if (d.verdict == Certified::certified) {
                ++certified;
                report.worst_bound = std::max(report.worst_bound, d.bound);
            }
            wrong += d.verdict == Certified::wrong;
            undecided += d.verdict == Certified::undecided;
        }
    };
    count(report.derivatives, report.certified, report.wrong, report.undecided);
    count(report.branches, report.branches_certified, report.branches_wrong, report.branches_undecided);
}

/// The leaves on `tape`, each element made by `element(flat, x)` from its double x and its flat
/// index counted across the leaves in order (a point, or a dual seeded with a tangent).
template <Scalar T, class Element>
std::vector<Var<T>> interval_leaves(Tape<T>& tape, std::span<const NamedTensor> leaves, const Element& element) {
    std::vector<Var<T>> vars;
    std::size_t offset = 0;
    for (const NamedTensor& leaf : leaves) {
        Tensor<T> value(leaf.value.shape());
        for (std::size_t k = 0; k < value.size(); ++k) value[k] = element(offset + k, leaf.value[k]);
        offset += value.size();
        vars.push_back(tape.leaf(std::move(value), leaf.name));
    }
    return vars;
}

/// The one element of J, refused otherwise (`what` names the caller).
template <Scalar T>
void require_one_element(const Var<T>& J, std::string_view what) {
    if (J.shape().size() != 1) {
        throw usage_error(fmt::format("{}: J must have one element, it has shape {}", what, J.shape().to_string()));
    }
}

/// What one run in intervals gives: an enclosure, and the first ambiguous comparison of the run,
/// named (empty when there was none).
struct Enclosure {
    Interval value;
    std::string kink;
};

/// The first ambiguity since the last clear, named with its node on `tape`; empty when none.
template <class T>
std::string kink_of(const Tape<T>& tape, std::string_view pass) {
    const IntervalAmbiguityLog log = interval_ambiguities();
    return log.count == 0 ? std::string() : describe_ambiguity(log, tape, pass);
}

/// Progress, one call per element judged (whole or branch), as CertifyOptions says.
struct ProgressCount {
    const CertifyOptions& options;
    std::string_view stage;
    std::size_t all = 0, done = 0;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    void step() {
        ++done;
        if (!options.progress) return;
        const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
        options.progress(CheckProgress{stage, done, all, all, seconds.count()});
    }
};

/// One element's verdict from its two enclosures, or undecided at the first kink of either run.
inline CertifiedDerivative element_verdict(std::string leaf, std::size_t k, Enclosure derivative,
                                           const Interval& claimed, const std::string& claimed_kink,
                                           std::string branch = {}) {
    CertifiedDerivative d;
    d.leaf = std::move(leaf);
    d.index = k;
    d.branch = std::move(branch);
    d.derivative = std::move(derivative.value);
    d.vjp = claimed;
    if (!derivative.kink.empty() || !claimed_kink.empty()) {
        d.verdict = Certified::undecided;
        d.kink = !derivative.kink.empty() ? std::move(derivative.kink) : claimed_kink;
    } else {
        judge(d);
    }
    return d;
}

/// The verdict of every element: `claimed[l][k]` encloses what the library's reverse path gives
/// (`claimed_kink` from its run), `exact(flat, leaf, k)` the exact derivative by forward mode, one
/// run per element.
template <class Exact>
void judge_every_element(CertificationReport& report, std::span<const NamedTensor> leaves,
                         const std::vector<Tensor<Interval>>& claimed, const std::string& claimed_kink, Exact&& exact,
                         ProgressCount& progress) {
    std::size_t flat = 0;
    for (std::size_t l = 0; l < leaves.size(); ++l) {
        for (std::size_t k = 0; k < leaves[l].value.size(); ++k, ++flat) {
            clear_interval_ambiguities();
            Enclosure derivative = exact(flat, leaves[l].name, k);
            report.derivatives.push_back(
                element_verdict(leaves[l].name, k, std::move(derivative), claimed[l][k], claimed_kink));
            progress.step();
        }
    }
}

/// The number of elements of `leaves`, all leaves together.
inline std::size_t element_count(std::span<const NamedTensor> leaves) {
    std::size_t elements = 0;
    for (const NamedTensor& leaf : leaves) elements += leaf.value.size();
    return elements;
}

/// One branch of a leaf that feeds several ops: the edge into its consumer, named as the
/// checker names it, and what the VJPs gave along it (the consumer's contribution, enclosed).
struct BranchToCertify {
    std::size_t leaf = 0;
    typename Tape<Interval>::Edge edge{};
    std::string consumer;
    Tensor<Interval> claimed;
};

/// The branches of every leaf with two consumers or more, from a reverse tape that logged them.
inline std::vector<BranchToCertify> branches_of(const Tape<Interval>& reverse, std::span<const Var<Interval>> leaves) {
    std::vector<BranchToCertify> branches;
    for (std::size_t l = 0; l < leaves.size(); ++l) {
        const auto edges = reverse.consumers(leaves[l]);
        if (edges.size() < 2) continue;
        for (const auto& edge : edges) {
            const NodeInfo consumer = reverse.info(edge.consumer);
            BranchToCertify b{l, edge,
                              fmt::format("{} -> {} (input {})", consumer.op,
                                          consumer.label.empty() ? fmt::format("node {}", edge.consumer)
                                                                 : std::string(consumer.label),
                                          edge.slot),
                              Tensor<Interval>(leaves[l].shape())};
            for (const Branch<Interval>& flow : reverse.branches()) {
                if (flow.consumer == edge.consumer && flow.slot == edge.slot && flow.target == leaves[l].index()) {
                    for (std::size_t k = 0; k < b.claimed.size(); ++k) b.claimed[k] += flow.contribution[k];
                }
            }
            branches.push_back(std::move(b));
        }
    }
    return branches;
}

/// ∂J/∂x_k along one edge alone, forward mode: the nodes of `tape` (the graph recorded in duals
/// with every tangent 0) downstream of `leaf` computed again with `seeded` (the leaf's value with
/// the tangent 1 at k) as the input of that edge only, every other use of the leaf seeing it
/// unseeded; J's tangent. Each op's forward runs inside its node's context, so a kink is named.
inline Enclosure derivative_along_edge(const Tape<Dual<Interval>>& tape, std::uint32_t leaf,
                                       typename Tape<Interval>::Edge edge, const Tensor<Dual<Interval>>& seeded,
                                       std::uint32_t J, std::string_view pass) {
    using D = Dual<Interval>;
    std::vector<Tensor<D>> values(J + 1);
    std::vector<char> changed(J + 1, 0);
    Tensor<D> saved;
    for (std::uint32_t i = leaf + 1; i <= J; ++i) {
        const auto node = tape.recorded(i);
        if (node.kind == nullptr) continue;
        std::array<const Tensor<D>*, max_arity> in{};
        bool touched = false;
        for (std::size_t slot = 0; slot < node.inputs.size(); ++slot) {
            const std::uint32_t source = node.inputs[slot];
            const bool seeded_here = source == leaf && i == edge.consumer && slot == edge.slot;
            in[slot] = seeded_here ? &seeded : changed[source] ? &values[source] : &tape.recorded(source).value;
            touched = touched || seeded_here || changed[source];
        }
        if (!touched) continue;
        changed[i] = 1;
        struct InNode {
            explicit InNode(std::uint32_t node) { enter_node<D>(node, false); }
            ~InNode() { leave_node<D>(); }
        } const context(i);
        node.kind->forward(node.settings, Inputs<D>(in.data(), node.inputs.size()), values[i], saved);
    }
    return Enclosure{changed[J] ? values[J][0].tangent() : Interval(0), kink_of(tape, pass)};
}

/// The verdicts of `branches` (see BranchToCertify), each element by derivative_along_edge on the
/// graph recorded once on a Tape<Dual<Interval>> with every tangent 0.
template <class Graph>
void certify_branches(CertificationReport& report, Graph& graph, std::span<const NamedTensor> leaves,
                      const std::vector<BranchToCertify>& branches, std::size_t reverse_nodes,
                      const std::string& reverse_kink, const CertifyOptions& options) {
    ProgressCount progress{options, "branch certification", 0};
    for (const BranchToCertify& b : branches) progress.all += b.claimed.size();
    Tape<Dual<Interval>> recorded;
    const std::vector<Var<Dual<Interval>>> duals = interval_leaves(
        recorded, leaves, [](std::size_t, double x) { return Dual<Interval>(Interval(x), Interval(0)); });
    const Var<Dual<Interval>> J = graph(std::span<const Var<Dual<Interval>>>(duals));
    if (recorded.size() != reverse_nodes) {  // the edges are the interval tape's node numbers
        throw usage_error(
            fmt::format("certify_gradients: the graph recorded {} nodes in intervals and {} in duals; "
                        "it must record the same nodes whatever its scalar type",
                        reverse_nodes, recorded.size()));
    }
    for (const BranchToCertify& b : branches) {
        const NamedTensor& leaf = leaves[b.leaf];
        Tensor<Dual<Interval>> seeded = duals[b.leaf].value();
        for (std::size_t k = 0; k < seeded.size(); ++k) {
            clear_interval_ambiguities();
            seeded[k] = Dual<Interval>(seeded[k].value(), Interval(1));
            Enclosure derivative =
                derivative_along_edge(recorded, duals[b.leaf].index(), b.edge, seeded, J.index(),
                                      fmt::format("forward pass of {}[{}] via {}", leaf.name, k, b.consumer));
            seeded[k] = Dual<Interval>(seeded[k].value(), Interval(0));
            report.branches.push_back(
                element_verdict(leaf.name, k, std::move(derivative), b.claimed[k], reverse_kink, b.consumer));
            progress.step();
        }
    }
}

/// Certifies every gradient element of `graph`, a callable from the leaves (a span of Vars, on a
/// Tape<Interval> or a Tape<Dual<Interval>>) to a one-element J, at `leaves`: the work of both
/// certify_gradients below. See the top of this file.
template <class Graph>
CertificationReport certify(Graph&& graph, std::span<const NamedTensor> leaves, const CertifyOptions& options) {
    const std::lock_guard turn(interval_state().run);
    // (1) The VJPs, in intervals, each branch's contribution kept.
    clear_interval_ambiguities();
    Tape<Interval> reverse;
    reverse.log_branches(true);
    const std::vector<Var<Interval>> vars =
        interval_leaves(reverse, leaves, [](std::size_t, double x) { return Interval(x); });
    const Var<Interval> J = graph(std::span<const Var<Interval>>(vars));
    require_one_element(J, "certify_gradients");
    reverse.backward(J);
    const std::string reverse_kink = kink_of(reverse, "backward pass");
    std::vector<Tensor<Interval>> claimed;
    for (const Var<Interval>& v : vars) claimed.push_back(v.grad());
    const std::vector<BranchToCertify> branches = branches_of(reverse, vars);
    ProgressCount progress{options, "certification", element_count(leaves)};
    CertificationReport report;
    // (2) Each element's derivative, one tangent at a time.
    const auto derivative = [&](std::size_t flat, const std::string& leaf, std::size_t k) {
        Tape<Dual<Interval>> forward;
        const std::vector<Var<Dual<Interval>>> duals = interval_leaves(
            forward, leaves,
            [flat](std::size_t at, double x) { return Dual<Interval>(Interval(x), Interval(at == flat ? 1 : 0)); });
        const Var<Dual<Interval>> J_dual = graph(std::span<const Var<Dual<Interval>>>(duals));
        return Enclosure{J_dual.value()[0].tangent(), kink_of(forward, fmt::format("forward pass of {}[{}]", leaf, k))};
    };
    judge_every_element(report, leaves, claimed, reverse_kink, derivative, progress);
    // (3) Each branch's elements, along its edge alone, on the graph recorded once in duals.
    if (!branches.empty()) certify_branches(report, graph, leaves, branches, reverse.size(), reverse_kink, options);
    count_verdicts(report);
    return report;
}

/// Certifies H·v of `graph` (as for certify above) along `direction` (one tensor per leaf): the
/// work of certify_hvp below. See there.
template <class Graph>
CertificationReport certify_hvp(Graph&& graph, std::span<const NamedTensor> leaves,
                                std::span<const Tensor<double>> direction, const CertifyOptions& options) {
    std::vector<double> v;  // the direction's elements, flat, as the leaves count them
    for (std::size_t l = 0; l < leaves.size(); ++l) {
        if (!(direction[l].shape() == leaves[l].value.shape())) {
            throw shape_error(
                fmt::format("certify_hvp: the direction for leaf {} ({}) has shape {}, the leaf has shape {}", l,
                            leaves[l].name, direction[l].shape().to_string(), leaves[l].value.shape().to_string()));
        }
        v.insert(v.end(), direction[l].data().begin(), direction[l].data().end());
    }
    const std::lock_guard turn(interval_state().run);
    // (1) H·v as the library computes it, forward over reverse: the leaves' tangents are v, the
    // reverse sweep runs the VJPs on duals, and each gradient's tangent is (H·v) there.
    clear_interval_ambiguities();
    Tape<Dual<Interval>> reverse;
    const std::vector<Var<Dual<Interval>>> vars = interval_leaves(
        reverse, leaves, [&v](std::size_t at, double x) { return Dual<Interval>(Interval(x), Interval(v[at])); });
    const Var<Dual<Interval>> J = graph(std::span<const Var<Dual<Interval>>>(vars));
    require_one_element(J, "certify_hvp");
    reverse.backward(J);
    const std::string reverse_kink = kink_of(reverse, "forward-over-reverse pass");
    std::vector<Tensor<Interval>> claimed;
    for (const Var<Dual<Interval>>& x : vars) {
        Tensor<Interval> Hv(x.shape());
        for (std::size_t k = 0; k < Hv.size(); ++k) Hv[k] = x.grad()[k].tangent();
        claimed.push_back(std::move(Hv));
    }
    // (2) Each element's (H·v)_i = ∂²J/∂x_i∂v by forward over forward, from the forward code alone:
    // the inner tangent is the unit at i, the outer one v.
    using Second = Dual<Dual<Interval>>;
    const auto derivative = [&](std::size_t flat, const std::string& leaf, std::size_t k) {
        Tape<Second> forward;
        const std::vector<Var<Second>> duals = interval_leaves(forward, leaves, [&v, flat](std::size_t at, double x) {
            return Second(Dual<Interval>(Interval(x), Interval(at == flat ? 1 : 0)),
                          Dual<Interval>(Interval(v[at]), Interval(0)));
        });
        const Var<Second> J_second = graph(std::span<const Var<Second>>(duals));
        return Enclosure{J_second.value()[0].tangent().tangent(),
                         kink_of(forward, fmt::format("second-order forward pass of {}[{}]", leaf, k))};
    };
    ProgressCount progress{options, "HVP certification", element_count(leaves)};
    CertificationReport report;
    judge_every_element(report, leaves, claimed, reverse_kink, derivative, progress);
    count_verdicts(report);
    return report;
}

}  // namespace detail

/// Certifies every gradient element of `graph` (a generic lambda from an array of N Vars to a
/// one-element J) at `leaves`. See the top of this file.
template <std::size_t N, class Graph>
CertificationReport certify_gradients(Graph&& graph, const std::array<NamedTensor, N>& leaves,
                                      const CertifyOptions& options = {}) {
    return detail::certify(
        [&graph]<Scalar T>(std::span<const Var<T>> vars) {
            std::array<Var<T>, N> in;
            std::copy(vars.begin(), vars.end(), in.begin());
            return graph(in);
        },
        std::span<const NamedTensor>(leaves), options);
}

/// The same with the leaves written in place, `certify_gradients(graph, {{"X", X}, {"W", W}})`.
template <std::size_t N, class Graph>
CertificationReport certify_gradients(Graph&& graph, const NamedTensor (&leaves)[N],
                                      const CertifyOptions& options = {}) {
    return certify_gradients(graph, std::to_array(leaves), options);
}

/// Certifies the Hessian-vector product of `graph` (a generic lambda from an array of N Vars to a
/// one-element J) at `leaves` along `v` (one tensor per leaf, the leaves' shapes), element by
/// element: H·v as the library computes it, forward over reverse (the VJPs run on duals,
/// autodiff/forward_mode.hpp's hvp), enclosed in intervals, against ∂²J/∂x_i∂v from the forward code
/// alone, forward over forward on a Tape<Dual<Dual<Interval>>> (one run per element). The report
/// reads as certify_gradients' (`vjp` is the forward-over-reverse enclosure, `derivative` the
/// forward-over-forward one); a kink met in either run leaves the element undecided. A VJP right at
/// first order but whose tangent is wrong (a saved value not differentiated through) is reported
/// wrong here while certify_gradients certifies it.
template <std::size_t N, class Graph>
CertificationReport certify_hvp(Graph&& graph, const std::array<NamedTensor, N>& leaves,
                                const std::array<Tensor<double>, N>& v, const CertifyOptions& options = {}) {
    return detail::certify_hvp(
        [&graph]<Scalar T>(std::span<const Var<T>> vars) {
            std::array<Var<T>, N> in;
            std::copy(vars.begin(), vars.end(), in.begin());
            return graph(in);
        },
        std::span<const NamedTensor>(leaves), std::span<const Tensor<double>>(v), options);
}

/// The same with the leaves and the direction written in place.
template <std::size_t N, class Graph>
CertificationReport certify_hvp(Graph&& graph, const NamedTensor (&leaves)[N], const Tensor<double> (&v)[N],
                                const CertifyOptions& options = {}) {
    return certify_hvp(graph, std::to_array(leaves), std::to_array(v), options);
}

/// Certifies every gradient element of a graph that ordinary code recorded on a Tape<double> or
/// Tape<float>, as it stands: the tape re-run in intervals (autodiff/interval_rerun.hpp; leaves,
/// constants and each op's recorded settings taken exactly, as the recorded check takes them at 50
/// digits, check/recorded.hpp), once in reverse and once per leaf element in forward mode, with the
/// verdicts of the generic-lambda form above. The leaves are the tape's leaves that need a gradient,
/// named by their labels ("leaf 3" for an unnamed one), in recorded order; J must have one element.
/// A user's op on the tape needs its interval siblings (register_certify_siblings); the library's
/// ops have theirs. Compiled in tapegrad::certify: a program calling it compiles no interval code.
CertificationReport certify_gradients(const Tape<double>& tape, const Var<double>& J,
                                      const CertifyOptions& options = {});
CertificationReport certify_gradients(const Tape<float>& tape, const Var<float>& J, const CertifyOptions& options = {});

inline std::string CertificationReport::summary() const {
    std::string text = fmt::format("certified {} of {} derivatives", certified, derivatives.size());
    if (certified > 0) text += fmt::format(": |VJP - derivative| <= {:.2g}, proven", worst_bound);
    if (wrong > 0) text += fmt::format("; WRONG {}", wrong);
    if (undecided > 0) text += fmt::format("; undecided at a kink {}", undecided);
    if (!branches.empty()) {
        text += fmt::format("; branches: certified {} of {}", branches_certified, branches.size());
        if (branches_wrong > 0) text += fmt::format(", WRONG {}", branches_wrong);
        if (branches_undecided > 0) text += fmt::format(", undecided at a kink {}", branches_undecided);
    }
    // The first wrong and the first undecided element, whole gradients before branches.
    const auto name = [](const CertifiedDerivative& d) {
        return d.branch.empty() ? fmt::format("{}[{}]", d.leaf, d.index)
                                : fmt::format("{}[{}] via {}", d.leaf, d.index, d.branch);
    };
    const auto first = [&](Certified verdict) -> const CertifiedDerivative* {
        for (const std::vector<CertifiedDerivative>* list : {&derivatives, &branches})
            for (const CertifiedDerivative& d : *list)
                if (d.verdict == verdict) return &d;
        return nullptr;
    };
    if (const CertifiedDerivative* d = first(Certified::wrong)) {
        text += fmt::format("\n  WRONG {}: derivative in {}, VJP in {}: apart by at least {:.3g}", name(*d),
                            d->derivative.text(), d->vjp.text(), d->bound);
    }
    if (const CertifiedDerivative* d = first(Certified::undecided)) {
        text += fmt::format("\n  undecided {}: {}", name(*d), d->kink);
    }
    return text;
}

}  // namespace tapegrad
