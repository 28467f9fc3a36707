/// \file
/// The gradient checker. A graph is written once, as a generic lambda over the scalar type that
/// takes its leaves as an array of Vars and returns the scalar J:
///
///     auto graph = [](auto leaves) { auto [X, W] = leaves; return sum(matmul(X, W)); };
///     CheckReport report = check_gradients(graph, {{"X", X}, {"W", W}});
///
/// It is run on a double tape (the analytic gradients a user gets) and on a 50-digit tape, and
/// both are compared with central finite differences computed in 50-digit arithmetic:
///   * double tape    vs 50-digit differences: agreement to `double_tolerance` (1e-9),
///   * 50-digit tape  vs 50-digit differences: agreement to `mp_tolerance` (1e-25),
/// at two step sizes, each coordinate of each leaf perturbed on its own. A leaf that feeds several
/// ops (X feeding Q, K and V) is also checked branch by branch: each consumer's contribution is
/// compared with differences in which only that consumer sees the perturbed X, so a wrong branch
/// is named. Fast mode compares directional derivatives <∇J, v> on random directions v and falls
/// back to the full check when one disagrees. Consistency checks run too: both precisions throw
/// or neither does; backward run twice gives identical gradients; a zero seed gives zero gradients.
///
/// Kinks: where J is not differentiable at the point checked (abs at 0, relu at 0, clamp at a
/// bound, max at a tie), a coordinate's one-sided differences (J(x+h) − J(x)) / h and
/// (J(x) − J(x−h)) / h part by the jump of the derivative instead of by about h·|J''|. When they part
/// by more than `kink_threshold` (1e-8, derived in check/report.hpp) at both steps, the coordinate
/// (or branch coordinate) is reported AT A KINK, with both one-sided derivatives and the analytic
/// value: neither a pass nor a failure, out of the max errors, and the verdict does not fail on
/// it. Where the two sides agree, the comparison is the usual one, so a wrong VJP at a smooth point
/// fails as before. A fast-mode direction at a kink sends the check to full mode, like a failure.
///
/// The options, their thresholds and the report are in check/report.hpp. The check is compiled once,
/// in the library (src/check/gradcheck.cpp): this header only turns the graph into one function per
/// tape type (detail::GraphOnTapes) and the leaves into a span, so a program that checks a graph
/// compiles its graph and nothing of the checker. There the check runs in stages, one function
/// each, sharing their state through a detail::Checked:
///   record_both                  the graph on both tapes (or a consistency failure, and stop),
///   tape_gradients               the analytic gradients (hand_derived_gradients for a hand backward),
///   check_backward_consistency   backward twice, zero seed,
///   full_check, fast_check       the whole gradients (fast falls back to full),
///   attribute_branches           each consumer's share of a shared leaf's gradient,
///   finish                       the figures into the report.
/// Every finite difference goes through numeric_derivative; every comparison (and every kink
/// classification) through compare. The stages list the differences they need as probes and get
/// them all from take_derivatives, which spreads them over the threads (and, given a WorkSplit,
/// over processes: check/distributed.hpp), then compare them in order: the report depends on
/// neither the threads nor the processes.
#pragma once

#include "autodiff/mp50.hpp"
#include "autodiff/rerun.hpp"
#include "autodiff/tape.hpp"
#include "check/report.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace tapegrad {

/// A leaf of a checked graph: its name (for reports) and its value.
struct NamedTensor {
    std::string name;
    Tensor<double> value;
};

namespace detail {

/// The leaves of a recorded tape that need a gradient (gradient_leaves), as a check's named leaves:
/// each named by its label ("leaf 3" for an unnamed one), its value exact in double. Refuses, naming
/// `check`, an output of another tape and an output that depends on no such leaf.
template <Scalar S>
std::vector<NamedTensor> recorded_leaves(const Tape<S>& tape, const Var<S>& output, std::string_view check) {
    if (!tape.holds(output)) {
        throw usage_error(
            fmt::format("{}: the output is not a value of this tape (another tape's, or from before a "
                        "clear())",
                        check));
    }
    std::vector<NamedTensor> leaves;
    for (const std::uint32_t i : gradient_leaves(tape, output)) {
        const auto node = tape.recorded(i);
        leaves.push_back(
            {node.label.empty() ? fmt::format("leaf {}", i) : std::string(node.label), tensor_as<double>(node.value)});
    }
    if (leaves.empty())
        throw usage_error(fmt::format("{}: the output depends on no leaf that needs a gradient", check));
    return leaves;
}

}  // namespace detail

/// The checker's error measure: |analytic − numeric| / max(1, |numeric|), absolute near zero and
/// relative for large values (what every threshold of the checker bounds).
double mixed_error(const mp50& analytic, const mp50& numeric);

/// What a full check of a graph would take, without taking it (tapegrad-check --plan): one group per
/// leaf's coordinates and one per branch of a leaf that feeds several ops (the derivatives the check
/// compares), each with its replay cost (the estimate MPI ranks' shares are balanced by: the work of
/// every node downstream of the moved leaf) and the CPU time of a few of its differences, measured
/// on this thread. Their product over the groups predicts the check's CPU time on one thread.
struct CheckPlan {
    struct Group {
        std::string leaf;
        bool branch = false;            ///< one consumer of the leaf, not the leaf itself
        std::size_t derivatives = 0;    ///< coordinates in the group
        double cost = 0;                ///< estimated replay cost, summed over the group
        double cpu_seconds_each = 0;    ///< measured mean CPU time of one derivative's differences
        std::size_t samples = 0;        ///< derivatives measured (spread over the group)
    };
    std::vector<Group> groups;

    std::size_t derivatives() const;
    double cost() const;
    double predicted_cpu_seconds() const;  ///< Σ derivatives × cpu_seconds_each
};

/// A gradient source other than the tape: a hand-derived backward (the spec's `backward`),
/// written as a generic lambda from the leaves' values to their gradients.
struct TapeGradients {};

namespace detail {

using Edge = Tape<mp50>::Edge;

/// The graph as the compiled checker calls it: one function per tape type, from the leaves' Vars
/// to J. graph_on_tapes builds it from the user's generic lambda, which takes an array of N Vars.
template <Scalar T>
using GraphOn = std::function<Var<T>(std::span<const Var<T>>)>;

struct GraphOnTapes {
    GraphOn<double> in_double;
    GraphOn<mp50> in_mp;
};

/// The N leaves (Vars or values) as the array a user's generic graph or hand backward takes.
template <std::size_t N, class Item>
std::array<Item, N> array_of(std::span<const Item> items) {
    std::array<Item, N> array;
    for (std::size_t l = 0; l < N; ++l) array[l] = items[l];
    return array;
}

template <std::size_t N, Scalar T, class Graph>
GraphOn<T> graph_on(Graph& graph) {
    return [&graph](std::span<const Var<T>> in) {
        std::array<Var<T>, N> leaves = array_of<N>(in);  // an lvalue: a graph may take its leaves by reference
        return Var<T>(graph(leaves));
    };
}

template <std::size_t N, class Graph>
GraphOnTapes graph_on_tapes(Graph& graph) {
    return GraphOnTapes{graph_on<N, double>(graph), graph_on<N, mp50>(graph)};
}

/// A hand-derived backward the same way: the leaves' values to their gradients, in each precision.
template <Scalar T>
using BackwardIn = std::function<std::vector<Tensor<T>>(std::span<const Tensor<T>>)>;

struct HandBackward {
    BackwardIn<double> in_double;
    BackwardIn<mp50> in_mp;
};

template <std::size_t N, Scalar T, class HandGradients>
BackwardIn<T> backward_in(HandGradients& hand_gradients) {
    return [&hand_gradients](std::span<const Tensor<T>> values) {
        std::array<Tensor<T>, N> leaves = array_of<N>(values);  // an lvalue, as for the graph
        const auto gradients = hand_gradients(leaves);
        return std::vector<Tensor<T>>(gradients.begin(), gradients.end());
    };
}

/// A graph recorded on a tape of scalar type T.
template <Scalar T>
struct Recording {
    Tape<T> tape;
    std::vector<Var<T>> leaves;
    Var<T> output;
};

/// Fills `parts` (already shaped) with one random unit vector: Gaussian draws normalised in double,
/// then held exactly in mp50. A unit direction keeps the truncation error h²|D³J[v,v,v]|/6 of a
/// directional difference within the same bound as for one coordinate, whatever the size.
void random_unit_direction(std::mt19937_64& generator, std::span<Tensor<mp50>> parts);

/// The differences are taken around each leaf's value: it must have one, and be finite.
void refuse_bad_leaves(std::span<const NamedTensor> leaves);

/// Keeps `m` among the `keep` worst mismatches, worst first, one line per place (`same_place` says
/// which two are one): a place's worse disagreement replaces its earlier one. The gradient checker's
/// tally and the JVP/HVP checks' report both keep their lists so.
template <class Entry, class SamePlace>
void keep_worst(std::vector<Entry>& worst, Entry m, std::size_t keep, SamePlace same_place) {
    const auto same = std::find_if(worst.begin(), worst.end(), [&](const Entry& w) { return same_place(w, m); });
    if (same != worst.end()) {
        if (same->rel_error >= m.rel_error) return;
        worst.erase(same);
    }
    worst.push_back(std::move(m));
    std::sort(worst.begin(), worst.end(), [](const Entry& a, const Entry& b) { return a.rel_error > b.rel_error; });
    if (worst.size() > keep) worst.pop_back();
}

/// Collects errors and the worst mismatches.
class Tally {
public:
    explicit Tally(std::size_t keep) : keep_(keep) {}
    void add(Mismatch m);
    /// Coordinates at kinks, the first few in the order compared (a fixed order). A direction at a
    /// kink is not listed: the coordinates it leads to are.
    void add_kink(Kink k) {
        if (kinks.size() < keep_) kinks.push_back(std::move(k));
    }
    double max_double = 0, max_mp = 0, max_step = 0;
    bool failed = false;
    std::vector<Mismatch> worst;
    std::vector<Kink> kinks;

private:
    std::size_t keep_;
};

/// The 50-digit differences of J at one step h: the central one, compared with the analytic
/// derivative, and the one-sided ones, which tell a kink (they part by the jump of the derivative)
/// from a smooth point (they part by about h·|J''|).
struct Differences {
    mp50 central;  ///< (J(x + h·v) − J(x − h·v)) / 2h
    mp50 right;    ///< (J(x + h·v) − J(x)) / h
    mp50 left;     ///< (J(x) − J(x − h·v)) / h
};

/// Who takes which finite differences. One process takes them all (no split); check/distributed.hpp
/// gives each MPI rank its share and gathers the others'.
class WorkSplit {
public:
    virtual ~WorkSplit() = default;
    /// Takes this process's share of the items by calling take(items), and fills `numeric` (sized
    /// like `costs`) with every item's differences, its own and the other processes'. costs[i] is
    /// item i's replay_cost. Throws when any process failed (then no process goes on).
    virtual void share(std::span<const double> costs, const std::function<void(std::span<const std::size_t>)>& take,
                       std::vector<std::array<Differences, 2>>& numeric) = 0;
};

/// What the stages share: the inputs, both recordings, the analytic gradients, the replay
/// workspaces, the comparisons so far and the report being filled.
struct Checked {
    Checked(std::span<const NamedTensor> leaves, const CheckOptions& options);
    ~Checked();
    std::span<const NamedTensor> leaves;
    const CheckOptions& options;
    std::unique_ptr<Recording<double>> in_double;
    std::unique_ptr<Recording<mp50>> in_mp;
    std::vector<Tensor<double>> grad_double;
    std::vector<Tensor<mp50>> grad_mp;
    std::vector<ReplayWorkspace<mp50>> workspaces;  ///< one per thread of a parallel_for
    Tally tally;
    CheckReport report;
    WorkSplit* split = nullptr;  ///< how the finite differences are shared among processes; none: all here

    unsigned threads() const { return static_cast<unsigned>(workspaces.size()); }
};

/// One finite difference to take: a coordinate of one leaf, or a direction over every leaf (fast
/// mode) or over one leaf (a branch); with `edge`, only that consumer sees the moved leaf.
struct Probe {
    std::size_t leaf = 0;   ///< the coordinate's leaf, or a branch direction's leaf
    std::size_t index = 0;  ///< the coordinate (unused for a direction)
    std::optional<Edge> edge{};
    std::span<const Tensor<mp50>> direction{};  ///< empty: a coordinate; one part: leaf `leaf`; all leaves' parts
};

/// The stages plan_of and the distributed checker use on their own (src/check/gradcheck.cpp says more).
bool record_both(Checked& c, const GraphOnTapes& graph);
std::vector<double> replay_costs(const Checked& c, std::span<const Probe> probes);

/// The plan of a check of `graph` (plan_check).
CheckPlan plan_of(const GraphOnTapes& graph, std::span<const NamedTensor> leaves, const CheckOptions& options,
                  std::size_t samples);

/// The whole check, the finite differences shared as `split` says (nullptr: all taken here); the
/// gradients from the tape, or from `hand` when given.
CheckReport run_check(const GraphOnTapes& graph, std::span<const NamedTensor> leaves, const CheckOptions& options,
                      const HandBackward* hand, WorkSplit* split);

}  // namespace detail

/// What check_gradients(graph, leaves, options) would take (CheckPlan), measuring `samples`
/// derivatives of each group (at least 2) instead of all of them.
template <std::size_t N, class Graph>
CheckPlan plan_check(Graph&& graph, const NamedTensor (&leaves)[N], const CheckOptions& options = {},
                     std::size_t samples = 4) {
    return detail::plan_of(detail::graph_on_tapes<N>(graph), leaves, options, samples);
}

/// Checks the gradients of `graph` with respect to each leaf. See the top of this file.
/// `hand_gradients` (optional) replaces the tape's gradients with a hand-derived backward.
template <std::size_t N, class Graph, class HandGradients = TapeGradients>
CheckReport check_gradients(Graph&& graph, const NamedTensor (&leaves)[N], const CheckOptions& options = {},
                            HandGradients hand_gradients = {}) {
    const detail::GraphOnTapes on_tapes = detail::graph_on_tapes<N>(graph);
    if constexpr (std::is_same_v<HandGradients, TapeGradients>) {
        return detail::run_check(on_tapes, leaves, options, nullptr, nullptr);
    } else {
        const detail::HandBackward hand{detail::backward_in<N, double>(hand_gradients),
                                        detail::backward_in<N, mp50>(hand_gradients)};
        return detail::run_check(on_tapes, leaves, options, &hand, nullptr);
    }
}

}  // namespace tapegrad
