// The gradient checker, compiled once into the library: every stage of check_gradients
// (check/gradcheck.hpp says what the check does and why). The header turns a user's graph into
// detail::GraphOnTapes, one function per tape type, so nothing here depends on the graph or on its
// number of leaves.
#include "check/gradcheck.hpp"

#include "autodiff/parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <exception>
#include <numeric>
#include <utility>

namespace tapegrad {

double mixed_error(const mp50& analytic, const mp50& numeric) {
    using boost::multiprecision::abs;
    const mp50 scale = std::max(mp50(1), mp50(abs(numeric)));
    return to_double(mp50(abs(analytic - numeric) / scale));
}

std::size_t CheckPlan::derivatives() const {
    std::size_t total = 0;
    for (const Group& g : groups) total += g.derivatives;
    return total;
}

double CheckPlan::cost() const {
    double total = 0;
    for (const Group& g : groups) total += g.cost;
    return total;
}

double CheckPlan::predicted_cpu_seconds() const {
    double total = 0;
    for (const Group& g : groups) total += static_cast<double>(g.derivatives) * g.cpu_seconds_each;
    return total;
}

namespace detail {

// The graph recorded on a new tape of `graph`'s type, the leaves as given. Heap-allocated because
// a tape stays where it was made (its Vars point at it).
template <Scalar T>
std::unique_ptr<Recording<T>> record(const GraphOn<T>& graph, std::span<const NamedTensor> leaves) {
    auto recording = std::make_unique<Recording<T>>();
    for (const NamedTensor& leaf : leaves) recording->leaves.push_back(recording->tape.leaf(tensor_cast<T>(leaf.value), leaf.name));
    recording->output = graph(recording->leaves);
    if (recording->output.shape().size() != 1) {
        throw usage_error(fmt::format("gradcheck: the graph must return a scalar J, it returned shape {}",
                                      recording->output.shape().to_string()));
    }
    return recording;
}

// Fills `parts` (already shaped) with one random unit vector: Gaussian draws normalised in double,
// then held exactly in mp50. A unit direction keeps the truncation error h²|D³J[v,v,v]|/6 of a
// directional difference within the same bound as for one coordinate, whatever the size.
void random_unit_direction(std::mt19937_64& generator, std::span<Tensor<mp50>> parts) {
    std::normal_distribution<double> normal;
    std::vector<double> draws;
    double squared = 0;
    for (const Tensor<mp50>& part : parts) {
        for (std::size_t c = 0; c < part.size(); ++c) {
            draws.push_back(normal(generator));
            squared += draws.back() * draws.back();
        }
    }
    const double norm = std::sqrt(squared);
    std::size_t k = 0;
    for (Tensor<mp50>& part : parts)
        for (mp50& x : part.data()) x = mp50(draws[k++] / norm);
}

// <g, v> summed in 50 digits over every part; a double g converts exactly.
template <class Gradients>
mp50 inner_product(const Gradients& gradient, std::span<const Tensor<mp50>> direction) {
    mp50 sum(0);
    for (std::size_t part = 0; part < direction.size(); ++part)
        for (std::size_t k = 0; k < direction[part].size(); ++k) sum += mp50(gradient[part][k]) * direction[part][k];
    return sum;
}

void Tally::add(Mismatch m) {
    double& worst_of_source = m.source == Source::double_tape      ? max_double
                              : m.source == Source::step_agreement ? max_step
                                                                   : max_mp;
    worst_of_source = std::max(worst_of_source, m.rel_error);
    if (m.rel_error <= m.threshold) return;  // written this way round so a NaN error fails
    failed = true;
    // One line per coordinate: keep only its worst disagreement.
    keep_worst(worst, std::move(m), keep_, [](const Mismatch& a, const Mismatch& b) {
        return a.leaf == b.leaf && a.index == b.index && a.branch == b.branch;
    });
}

Checked::Checked(std::span<const NamedTensor> leaves, const CheckOptions& options)
    : leaves(leaves), options(options), workspaces(thread_count()), tally(options.max_reported) {
    report.seed = options.seed;
}
Checked::~Checked() = default;

// One leaf moved for a finite difference: to x + h·direction, or, without a direction, only its
// coordinate `coordinate` to x + h. With `edge` set only that consumer sees the moved value, which
// takes one branch of a summed gradient on its own.
struct Move {
    Var<mp50> leaf;
    std::optional<Edge> edge;
    const Tensor<mp50>* direction = nullptr;
    std::size_t coordinate = 0;
    Tensor<mp50>* scratch = nullptr;  // the leaf's value before and after; its moved value during
};

void move_by(const Move& move, const mp50& h) {
    const Tensor<mp50>& x = move.leaf.value();
    Tensor<mp50>& moved = *move.scratch;
    if (move.direction == nullptr) {
        moved[move.coordinate] = x[move.coordinate] + h;
        return;
    }
    for (std::size_t k = 0; k < moved.size(); ++k) moved[k] = x[k] + h * (*move.direction)[k];
}

void restore(const Move& move) {
    const Tensor<mp50>& x = move.leaf.value();
    if (move.direction == nullptr) (*move.scratch)[move.coordinate] = x[move.coordinate];
    else *move.scratch = x;
}

// The differences at each of the two steps, with the leaves moved as `moves` say. J is replayed
// from the recorded tape (only what the moved leaves reach is recomputed), so threads may call
// this at once, each with its own workspace and scratch tensors. J(x) is the recorded output:
// the one-sided differences cost no replay beyond the central one's.
std::array<Differences, 2> numeric_derivative(const Recording<mp50>& in_mp, std::span<const Move> moves,
                                              const std::array<double, 2>& steps,
                                              ReplayWorkspace<mp50>& workspace) {
    std::vector<Tape<mp50>::Replacement> replacements;
    for (const Move& move : moves) replacements.push_back({move.leaf, move.scratch, move.edge});
    const auto J_at = [&](const mp50& h) {
        for (const Move& move : moves) move_by(move, h);
        return mp50(in_mp.tape.replay(in_mp.output, replacements, workspace).item());
    };
    const mp50 at_x(in_mp.output.value().item());
    std::array<Differences, 2> derivatives;
    for (std::size_t s = 0; s < steps.size(); ++s) {
        const mp50 h(steps[s]);
        const mp50 plus = J_at(h);
        const mp50 minus = J_at(mp50(-h));
        derivatives[s] = {mp50((plus - minus) / (2 * h)), mp50((plus - at_x) / h), mp50((at_x - minus) / h)};
    }
    for (const Move& move : moves) restore(move);
    return derivatives;
}

// J is at a kink along the move: the one-sided differences part by more than `threshold` at both
// steps, and each side agrees with itself across the steps within it (both converged). Written
// so that a NaN anywhere gives false: such a coordinate is compared, and fails, as before.
bool at_kink(const std::array<Differences, 2>& numeric, double threshold) {
    const auto parted = [&](const Differences& d) { return mixed_error(d.right, d.left) > threshold; };
    const bool converged = mixed_error(numeric[0].right, numeric[1].right) <= threshold &&
                           mixed_error(numeric[0].left, numeric[1].left) <= threshold;
    return parted(numeric[0]) && parted(numeric[1]) && converged;
}

// Every coordinate of leaf `l`, of the whole gradient or (with `edge`) of one branch.
std::vector<Probe> coordinate_probes(const Checked& c, std::size_t l, const std::optional<Edge>& edge = {}) {
    std::vector<Probe> probes;
    for (std::size_t k = 0; k < c.leaves[l].value.size(); ++k) probes.push_back({l, k, edge, {}});
    return probes;
}

// The differences of one probe, with this thread's copies of the leaves (made when first needed).
std::array<Differences, 2> take_probe(const Checked& c, const Probe& probe, std::vector<Tensor<mp50>>& scratch,
                                      ReplayWorkspace<mp50>& workspace) {
    const auto move_of = [&](std::size_t l, const Tensor<mp50>* direction) {
        const Var<mp50>& leaf = c.in_mp->leaves[l];
        if (scratch[l].size() == 0) scratch[l] = leaf.value();  // leaves are never empty
        return Move{leaf, probe.edge, direction, probe.index, &scratch[l]};
    };
    std::vector<Move> moves;
    if (probe.direction.empty()) moves.push_back(move_of(probe.leaf, nullptr));
    else if (probe.direction.size() == 1) moves.push_back(move_of(probe.leaf, &probe.direction[0]));
    else
        for (std::size_t l = 0; l < c.leaves.size(); ++l) moves.push_back(move_of(l, &probe.direction[l]));
    return numeric_derivative(*c.in_mp, std::span<const Move>(moves), c.options.steps, workspace);
}

// What a probe costs to replay, roughly: the multiply-adds and output elements of every node the
// moved leaf reaches (through `edge` only, when set). Only the ratios matter (how the probes are
// shared among processes), and probes of one leaf cost about the same.
double replay_cost(const Checked& c, const Probe& probe) {
    const Tape<mp50>& tape = c.in_mp->tape;
    std::vector<std::uint32_t> moved;
    for (std::size_t l = 0; l < c.leaves.size(); ++l)
        if (probe.direction.size() > 1 || l == probe.leaf) moved.push_back(c.in_mp->leaves[l].index());
    const std::size_t output = c.in_mp->output.index();
    std::vector<char> reached(output + 1, 0);
    double cost = 0;
    for (std::size_t i = 0; i <= output; ++i) {
        const NodeInfo node = tape.info(i);
        for (std::uint32_t slot = 0; slot < node.inputs.size(); ++slot) {
            const std::uint32_t source = node.inputs[slot];
            const bool from_moved = std::find(moved.begin(), moved.end(), source) != moved.end() &&
                                    (!probe.edge || (probe.edge->consumer == i && probe.edge->slot == slot));
            reached[i] = reached[i] || reached[source] || from_moved;
        }
        if (reached[i]) cost += static_cast<double>(node.cost.forward_madds + node.shape.size());
    }
    return cost;
}

// replay_cost of each probe; consecutive probes of one leaf (and edge) share theirs.
std::vector<double> replay_costs(const Checked& c, std::span<const Probe> probes) {
    std::vector<double> costs;
    for (std::size_t i = 0; i < probes.size(); ++i) {
        const Probe& p = probes[i];
        const Probe* before = i > 0 ? &probes[i - 1] : nullptr;
        const bool same = before && before->leaf == p.leaf && before->direction.size() == p.direction.size() &&
                          before->edge.has_value() == p.edge.has_value() &&
                          (!p.edge || (before->edge->consumer == p.edge->consumer && before->edge->slot == p.edge->slot));
        costs.push_back(same ? costs.back() : replay_cost(c, p));
    }
    return costs;
}

// The differences of every probe, in order. This process's share is spread over its threads;
// the callers compare the differences afterwards, in order, so the report depends neither on the
// number of threads nor on the number of processes.
std::vector<std::array<Differences, 2>> take_derivatives(Checked& c, std::string_view stage,
                                                         std::span<const Probe> probes) {
    std::vector<std::array<Differences, 2>> numeric(probes.size());
    const auto start = std::chrono::steady_clock::now();
    const auto report = [&](std::size_t finished, std::size_t mine) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        c.options.progress(CheckProgress{stage, finished, mine, probes.size(), seconds});
    };
    const auto take = [&](std::span<const std::size_t> items) {
        std::vector<std::vector<Tensor<mp50>>> scratch(c.threads(), std::vector<Tensor<mp50>>(c.leaves.size()));
        std::atomic<std::size_t> done{0};
        parallel_for(
            items.size(),
            [&](std::size_t i, unsigned thread) {
                numeric[items[i]] = take_probe(c, probes[items[i]], scratch[thread], c.workspaces[thread]);
                const std::size_t finished = ++done;
                // The first thread reports what is done so far; the last call, all of this
                // process's share, is made once every thread has finished (another thread may
                // take the last derivative).
                if (thread != 0 || !c.options.progress || finished == items.size()) return;
                report(finished, items.size());
            },
            c.threads());
        if (c.options.progress && !items.empty()) report(items.size(), items.size());
    };
    if (c.split == nullptr) {
        std::vector<std::size_t> all(probes.size());
        std::iota(all.begin(), all.end(), std::size_t{0});
        take(all);
        return numeric;
    }
    c.split->share(replay_costs(c, probes), take, numeric);
    return numeric;
}

// Where a derivative was taken, as the report names it.
struct Where {
    std::string leaf, index, branch;
};

// What one comparison found: agreement, a failure, or a kink (neither).
enum class Outcome { pass, failure, kink };

struct Verdict {
    Outcome outcome = Outcome::pass;
    double mp_error = 0;  // the worst of the 50-digit tape's errors (0 at a kink)
    Kink kink;            // at a kink: where, and both sides; the coordinate checks list it
};

// At a kink (at_kink), any value between the one-sided derivatives is a valid choice (a
// subgradient along this coordinate: abs at 0 may say −1, 0 or 1), so the verdict is "kink", with
// the one-sided derivatives at steps[1]; a value outside them is wrong whatever the convention,
// and is compared with the nearer side as a failure. The one-sided differences carry an error of
// about h·|J''| ≤ 1e-11 (see kink_threshold), so "between" allows kink_threshold beyond each side.
// Otherwise the analytic derivative (50-digit, and double when given)
// against the central difference at each step, and the two steps against each other; every
// comparison goes into the tally.
Verdict compare(Checked& c, const Where& where, const mp50& analytic_mp,
                const std::optional<double>& analytic_double, const std::array<Differences, 2>& numeric) {
    using boost::multiprecision::abs;
    Verdict verdict;
    const auto against = [&](Source source, const mp50& analytic, const mp50& reference, double step,
                             double threshold) {
        const double error = mixed_error(analytic, reference);
        if (!(error <= threshold)) verdict.outcome = Outcome::failure;
        const bool from_mp_tape = source == Source::mp_tape || source == Source::mp_tape_at_kink;
        if (from_mp_tape) verdict.mp_error = std::max(verdict.mp_error, error);
        c.tally.add(Mismatch{where.leaf, where.index, where.branch, source, to_double(analytic),
                             to_double(reference), step, to_double(mp50(abs(analytic - reference))), error,
                             threshold});
    };
    if (at_kink(numeric, c.options.kink_threshold)) {
        const mp50& left = numeric[1].left;
        const mp50& right = numeric[1].right;
        const mp50 nearest = std::clamp(analytic_mp, std::min(left, right), std::max(left, right));
        if (mixed_error(analytic_mp, nearest) <= c.options.kink_threshold) {
            verdict.outcome = Outcome::kink;
            verdict.kink = Kink{where.leaf, where.index, where.branch, to_double(left), to_double(right),
                                to_double(analytic_mp)};
        } else {
            against(Source::mp_tape_at_kink, analytic_mp, nearest, c.options.steps[1], c.options.kink_threshold);
        }
        return verdict;
    }
    for (std::size_t s = 0; s < numeric.size(); ++s) {
        against(Source::mp_tape, analytic_mp, numeric[s].central, c.options.steps[s], c.options.mp_tolerance);
        if (analytic_double) {
            against(Source::double_tape, mp50(*analytic_double), numeric[s].central, c.options.steps[s],
                    c.options.double_tolerance);
        }
    }
    against(Source::step_agreement, numeric[0].central, numeric[1].central, c.options.steps[1],
            c.options.mp_tolerance);
    return verdict;
}

// A coordinate's verdict into its counts; a kink also into the report's list.
void count_coordinate(Checked& c, Verdict verdict, std::size_t& failures, std::size_t& kinks) {
    if (verdict.outcome == Outcome::failure) ++failures;
    if (verdict.outcome == Outcome::kink) {
        ++kinks;
        c.tally.add_kink(std::move(verdict.kink));
    }
}

// The differences are taken around each leaf's value: it must have one, and be finite.
void refuse_bad_leaves(std::span<const NamedTensor> leaves) {
    for (const NamedTensor& leaf : leaves) {
        const Tensor<double>& value = leaf.value;
        if (value.size() == 0) throw shape_error(fmt::format("gradcheck: leaf {} is empty", leaf.name));
        for (std::size_t k = 0; k < value.size(); ++k) {
            if (!is_finite(value[k])) {
                throw value_error(fmt::format("gradcheck: leaf {} has the non-finite value {} at {}", leaf.name,
                                              value[k], index_string(value.shape(), k)));
            }
        }
    }
}

// The message of a std::exception; any other exception propagates from here.
std::string message_of(const std::exception_ptr& thrown) {
    try {
        std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
        return e.what();
    }
}

// Records the graph on both tapes. Both precisions must agree on whether the graph is defined at
// these inputs: when both throw, the inputs are at fault and the error is rethrown; when only one
// does, that is a consistency failure and there is nothing to compare (returns false).
bool record_both(Checked& c, const GraphOnTapes& graph) {
    std::exception_ptr double_error, mp_error;
    try {
        c.in_double = record(graph.in_double, c.leaves);
    } catch (...) {
        double_error = std::current_exception();
    }
    try {
        c.in_mp = record(graph.in_mp, c.leaves);
    } catch (...) {
        mp_error = std::current_exception();
    }
    if (double_error && mp_error) std::rethrow_exception(double_error);
    if (!double_error && !mp_error) return true;
    c.report.passed = false;
    c.report.mode = CheckMode::consistency;
    c.report.consistency_failures.push_back(fmt::format(
        "the {} forward threw ({}) but the {} forward did not", double_error ? "double" : "50-digit",
        message_of(double_error ? double_error : mp_error), double_error ? "50-digit" : "double"));
    return false;
}

// The analytic gradients from both tapes. The 50-digit backward also logs each edge's
// contribution when the branches are to be attributed.
void tape_gradients(Checked& c) {
    Recording<double>& in_double = *c.in_double;
    in_double.tape.backward(in_double.output);
    for (const Var<double>& leaf : in_double.leaves) c.grad_double.push_back(leaf.grad());
    Recording<mp50>& in_mp = *c.in_mp;
    in_mp.tape.log_branches(c.options.check_branches);
    in_mp.tape.backward(in_mp.output);
    for (const Var<mp50>& leaf : in_mp.leaves) c.grad_mp.push_back(leaf.grad());
}

// The analytic gradients from a hand-derived backward, run in both precisions.
void hand_derived_gradients(Checked& c, const HandBackward& hand_gradients) {
    std::vector<Tensor<double>> values_double;
    std::vector<Tensor<mp50>> values_mp;
    for (const NamedTensor& leaf : c.leaves) {
        values_double.push_back(leaf.value);
        values_mp.push_back(tensor_cast<mp50>(leaf.value));
    }
    c.grad_double = hand_gradients.in_double(values_double);
    c.grad_mp = hand_gradients.in_mp(values_mp);
    if (c.grad_double.size() != c.leaves.size() || c.grad_mp.size() != c.leaves.size()) {
        throw usage_error(fmt::format("gradcheck: the hand-derived backward returned {} gradients for {} leaves",
                                      c.grad_double.size(), c.leaves.size()));
    }
    for (std::size_t l = 0; l < c.leaves.size(); ++l) {
        const Shape& shape = c.leaves[l].value.shape();
        if (!(c.grad_double[l].shape() == shape) || !(c.grad_mp[l].shape() == shape)) {
            throw shape_error(fmt::format("gradcheck: the hand-derived gradient of {} has shape {}, the leaf {}",
                                          c.leaves[l].name, c.grad_double[l].shape().to_string(),
                                          shape.to_string()));
        }
    }
}

// On the double tape, whose first backward gave grad_double: a second backward must give the same
// gradients, and a zero upstream gradient zero ones. A VJP that reads stale state, or is not
// linear in G, fails here even where its values happen to be right.
void check_backward_consistency(Checked& c) {
    Tape<double>& tape = c.in_double->tape;
    const Var<double>& output = c.in_double->output;
    const auto& leaves = c.in_double->leaves;
    tape.zero_grad();
    tape.backward(output);
    for (std::size_t l = 0; l < c.leaves.size(); ++l) {
        if (!(leaves[l].grad() == c.grad_double[l])) {
            c.report.consistency_failures.push_back(
                fmt::format("backward run twice gave different gradients for {}", c.leaves[l].name));
        }
    }
    tape.zero_grad();
    tape.backward(output, Tensor<double>(output.shape(), 0.0));
    for (std::size_t l = 0; l < c.leaves.size(); ++l) {
        const auto gradient = leaves[l].grad().data();
        if (std::any_of(gradient.begin(), gradient.end(), [](double x) { return x != 0.0; })) {
            c.report.consistency_failures.push_back(
                fmt::format("a zero upstream gradient gave a non-zero gradient for {}", c.leaves[l].name));
        }
    }
}

// Every coordinate of every leaf, perturbed on its own.
void full_check(Checked& c) {
    std::vector<Probe> probes;
    for (std::size_t l = 0; l < c.leaves.size(); ++l) {
        const std::vector<Probe> of_leaf = coordinate_probes(c, l);
        probes.insert(probes.end(), of_leaf.begin(), of_leaf.end());
    }
    const std::vector<std::array<Differences, 2>> numeric = take_derivatives(c, "full check", probes);
    for (std::size_t i = 0; i < probes.size(); ++i) {
        const std::size_t l = probes[i].leaf, k = probes[i].index;
        ++c.report.coordinates;
        const Where where{c.leaves[l].name, index_string(c.leaves[l].value.shape(), k), ""};
        count_coordinate(c, compare(c, where, c.grad_mp[l][k], c.grad_double[l][k], numeric[i]), c.report.failures,
                         c.report.kinks);
    }
}

// Fast mode: <∇J, v> against the directional difference, for a few random unit directions over
// all leaves at once. When one disagrees or is at a kink, its figures are dropped and the full
// check runs instead, to say which coordinates are wrong or at kinks.
void fast_check(Checked& c) {
    c.report.mode = CheckMode::fast;
    std::mt19937_64 generator(c.options.seed);
    std::vector<std::vector<Tensor<mp50>>> directions(c.options.directions);
    std::vector<Probe> probes;
    for (std::vector<Tensor<mp50>>& direction : directions) {
        for (const NamedTensor& leaf : c.leaves) direction.emplace_back(leaf.value.shape());
        random_unit_direction(generator, direction);
        probes.push_back(Probe{0, 0, std::nullopt, direction});
    }
    const std::vector<std::array<Differences, 2>> numeric = take_derivatives(c, "fast check", probes);
    bool all_agree = true;
    for (std::size_t k = 0; k < directions.size(); ++k) {
        ++c.report.coordinates;
        const mp50 along_mp = inner_product(c.grad_mp, std::span<const Tensor<mp50>>(directions[k]));
        // The double side is compared through the mp sum of its products (exact for the inputs).
        const double along_double = to_double(inner_product(c.grad_double, std::span<const Tensor<mp50>>(directions[k])));
        const Where where{fmt::format("direction {}", k), "(all leaves)", ""};
        const Outcome outcome = compare(c, where, along_mp, along_double, numeric[k]).outcome;
        if (outcome == Outcome::failure) ++c.report.failures;
        all_agree = all_agree && outcome == Outcome::pass;
    }
    if (all_agree) return;
    c.report.mode = CheckMode::fast_then_full;
    c.tally = Tally(c.options.max_reported);
    c.report.coordinates = c.report.failures = c.report.kinks = 0;
    full_check(c);
}

// The tape's contribution along one edge (zero when the branch does not reach J).
Tensor<mp50> branch_contribution(const Tape<mp50>& tape, const Var<mp50>& leaf, const Edge& edge) {
    Tensor<mp50> contribution(leaf.shape());
    for (const Branch<mp50>& b : tape.branches()) {
        if (b.consumer == edge.consumer && b.slot == edge.slot && b.target == leaf.index()) {
            for (std::size_t k = 0; k < contribution.size(); ++k) contribution[k] += b.contribution[k];
        }
    }
    return contribution;
}

// "matmul -> K (input 0)": the consumer's op, its label (or node number) and the input slot.
std::string consumer_name(const Tape<mp50>& tape, const Edge& edge) {
    const NodeInfo consumer = tape.info(edge.consumer);
    return fmt::format("{} -> {} (input {})", consumer.op,
                       consumer.label.empty() ? fmt::format("node {}", edge.consumer) : std::string(consumer.label),
                       edge.slot);
}

// The branch along a few random unit directions over its leaf; false as soon as one disagrees or
// is at a kink (the coordinates then say which). All directions are taken at once (they may be
// shared among processes) and compared in order, so the report is the same either way.
bool branch_directions_agree(Checked& c, std::size_t l, const Edge& edge, const Tensor<mp50>& analytic,
                             BranchReport& branch) {
    // Seeded per edge, so each branch gets its own directions whatever else the graph holds.
    std::mt19937_64 generator(c.options.seed + 7919 * (edge.consumer + 1) + edge.slot);
    std::vector<Tensor<mp50>> directions(c.options.directions, Tensor<mp50>(c.leaves[l].value.shape()));
    std::vector<Probe> probes;
    for (Tensor<mp50>& direction : directions) {
        random_unit_direction(generator, std::span(&direction, 1));
        probes.push_back(Probe{l, 0, edge, std::span(&direction, 1)});
    }
    const std::vector<std::array<Differences, 2>> numeric =
        take_derivatives(c, fmt::format("branch {} via {}", c.leaves[l].name, branch.consumer), probes);
    for (std::size_t k = 0; k < directions.size(); ++k) {
        const mp50 along = inner_product(std::span(&analytic, 1), std::span<const Tensor<mp50>>(&directions[k], 1));
        const Where where{c.leaves[l].name, fmt::format("(direction {})", k), branch.consumer};
        const Verdict verdict = compare(c, where, along, std::nullopt, numeric[k]);
        branch.max_error_mp = std::max(branch.max_error_mp, verdict.mp_error);
        if (verdict.outcome != Outcome::pass) return false;
    }
    return true;
}

// The branch at every coordinate of its leaf.
void check_branch_coordinates(Checked& c, std::size_t l, const Edge& edge, const Tensor<mp50>& analytic,
                              BranchReport& branch) {
    const std::vector<std::array<Differences, 2>> numeric = take_derivatives(
        c, fmt::format("branch {} via {}", c.leaves[l].name, branch.consumer), coordinate_probes(c, l, edge));
    for (std::size_t k = 0; k < analytic.size(); ++k) {
        const Where where{c.leaves[l].name, index_string(analytic.shape(), k), branch.consumer};
        Verdict verdict = compare(c, where, analytic[k], std::nullopt, numeric[k]);
        branch.max_error_mp = std::max(branch.max_error_mp, verdict.mp_error);
        count_coordinate(c, std::move(verdict), branch.failures, branch.kinks);
    }
}

// The branches must add up to the whole gradient (the tape's accumulate step).
void check_branches_add_up(Checked& c, std::size_t l, const Tensor<mp50>& branch_sum) {
    for (std::size_t k = 0; k < branch_sum.size(); ++k) {
        if (mixed_error(branch_sum[k], c.grad_mp[l][k]) > c.options.mp_tolerance) {
            c.report.consistency_failures.push_back(
                fmt::format("the branches of {} do not add up to its gradient at {}", c.leaves[l].name,
                            index_string(branch_sum.shape(), k)));
            return;
        }
    }
}

// Each leaf with several consumers, each branch on its own: along directions after a fast check
// that passed, at every coordinate when a direction disagrees or the full check ran.
void attribute_branches(Checked& c) {
    const bool directions_first = c.report.mode == CheckMode::fast;
    for (std::size_t l = 0; l < c.leaves.size(); ++l) {
        const Var<mp50>& leaf = c.in_mp->leaves[l];
        const std::vector<Edge> edges = c.in_mp->tape.consumers(leaf);
        if (edges.size() < 2) continue;
        Tensor<mp50> branch_sum(leaf.shape());
        for (const Edge& edge : edges) {
            const Tensor<mp50> analytic = branch_contribution(c.in_mp->tape, leaf, edge);
            for (std::size_t k = 0; k < analytic.size(); ++k) branch_sum[k] += analytic[k];
            BranchReport branch{c.leaves[l].name, consumer_name(c.in_mp->tape, edge)};
            if (!directions_first || !branch_directions_agree(c, l, edge, analytic, branch)) {
                check_branch_coordinates(c, l, edge, analytic, branch);
            }
            c.report.branches.push_back(std::move(branch));
        }
        check_branches_add_up(c, l, branch_sum);
    }
}

// The tally's figures and the verdict, into the report.
CheckReport finish(Checked& c, std::chrono::steady_clock::time_point start) {
    CheckReport report = std::move(c.report);
    report.max_error_double = c.tally.max_double;
    report.max_error_mp = c.tally.max_mp;
    report.max_step_disagreement = c.tally.max_step;
    report.worst = std::move(c.tally.worst);
    report.first_kinks = std::move(c.tally.kinks);
    report.passed = !c.tally.failed && report.consistency_failures.empty();
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
}

// The stages in order, the finite differences shared as `split` says (nullptr: all taken here).
CheckReport run_check(const GraphOnTapes& graph, std::span<const NamedTensor> leaves, const CheckOptions& options,
                      const HandBackward* hand, WorkSplit* split) {
    const bool from_tape = hand == nullptr;
    const auto start = std::chrono::steady_clock::now();
    refuse_bad_leaves(leaves);
    Checked checked(leaves, options);
    checked.split = split;
    if (!record_both(checked, graph)) return std::move(checked.report);  // nothing to compare
    if (from_tape) {
        tape_gradients(checked);
        if (options.check_consistency) check_backward_consistency(checked);
    } else {
        hand_derived_gradients(checked, *hand);
    }
    if (options.mode == CheckOptions::Mode::fast) fast_check(checked);  // falls back to full itself
    else full_check(checked);
    // Branches are known from the tape only.
    if (from_tape && options.check_branches) attribute_branches(checked);
    return finish(checked, start);
}

// This thread's CPU time: on a shared machine the wall clock also counts waiting for a core.
double thread_cpu_seconds() {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// The groups full_check and attribute_branches would compare (each leaf's coordinates, then each
// of its branches when it feeds several ops), their replay costs, and `samples` derivatives of each
// taken and timed (spread over the group: costs vary a little with the index).
CheckPlan plan_of(const GraphOnTapes& graph, std::span<const NamedTensor> leaves, const CheckOptions& options,
                  std::size_t samples) {
    if (samples < 2) throw value_error(fmt::format("plan_check: samples = {}; at least 2 are measured", samples));
    refuse_bad_leaves(leaves);
    Checked c(leaves, options);
    if (!record_both(c, graph)) {
        throw value_error("plan_check: the graph cannot be recorded in both precisions at these leaves");
    }
    std::vector<std::vector<Probe>> groups;
    for (std::size_t l = 0; l < leaves.size(); ++l) {
        groups.push_back(coordinate_probes(c, l));
        const std::vector<Edge> edges = c.in_mp->tape.consumers(c.in_mp->leaves[l]);
        for (std::size_t e = 0; edges.size() > 1 && e < edges.size(); ++e) groups.push_back(coordinate_probes(c, l, edges[e]));
    }
    CheckPlan plan;
    std::vector<Tensor<mp50>> scratch(leaves.size());
    for (const std::vector<Probe>& group : groups) {
        const std::vector<double> costs = replay_costs(c, std::span<const Probe>(group));
        const std::size_t measured = std::min(samples, group.size());
        const double start = thread_cpu_seconds();
        for (std::size_t k = 0; k < measured; ++k) {
            const std::size_t at = measured == 1 ? 0 : k * (group.size() - 1) / (measured - 1);
            (void)take_probe(c, group[at], scratch, c.workspaces[0]);
        }
        plan.groups.push_back({.leaf = leaves[group[0].leaf].name,
                               .branch = group[0].edge.has_value(),
                               .derivatives = group.size(),
                               .cost = std::accumulate(costs.begin(), costs.end(), 0.0),
                               .cpu_seconds_each = (thread_cpu_seconds() - start) / static_cast<double>(measured),
                               .samples = measured});
    }
    return plan;
}

}  // namespace detail
}  // namespace tapegrad
