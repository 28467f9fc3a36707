// The gradient checker. A graph is written once, as a generic lambda over the scalar type that
// takes its leaves as an array of Vars and returns the scalar J:
//
//     auto graph = [](auto leaves) { auto [X, W] = leaves; return sum(matmul(X, W)); };
//     CheckReport report = check_gradients(graph, {{"X", X}, {"W", W}});
//
// It is run on a double tape (the analytic gradients a user gets) and on a 50-digit tape, and
// both are compared with central finite differences computed in 50-digit arithmetic:
//   * double tape    vs 50-digit differences: agreement to `double_tolerance` (1e-9),
//   * 50-digit tape  vs 50-digit differences: agreement to `mp_tolerance` (1e-25),
// at two step sizes, each coordinate of each leaf perturbed on its own. A leaf that feeds several
// ops (X feeding Q, K and V) is also checked branch by branch: each consumer's contribution is
// compared with differences in which only that consumer sees the perturbed X, so a wrong branch
// is named. Fast mode compares directional derivatives <∇J, v> on random directions v and falls
// back to the full check when one disagrees. Consistency checks run too: both precisions throw
// or neither does; backward run twice gives identical gradients; a zero seed gives zero gradients.
#pragma once

#include "autodiff/format.hpp"
#include "autodiff/tape.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace tapegrad {

// A leaf of a checked graph: its name (for reports) and its value.
struct NamedTensor {
    std::string name;
    Tensor<double> value;
};

struct CheckOptions {
    enum class Mode { full, fast };
    Mode mode = Mode::full;

    // Steps of the 50-digit central difference (J(x+h) − J(x−h)) / 2h. Its error is the truncation
    // term h²|J'''|/6 plus rounding ≈ ε|J|/h with ε ≈ 5e-51 (168-bit significand):
    //   h = 1e-14: ≤ 1.7e-29·|J'''| + 5e-37·|J|;   h = 1e-16: ≤ 1.7e-33·|J'''| + 5e-35·|J|.
    // Both are far below mp_tolerance for |J'''| up to 1e3 and |J| up to 1e9. Two steps two
    // decades apart must agree with each other too: that confirms the differences converged.
    std::array<double, 2> steps{1e-14, 1e-16};

    // 50-digit tape against 50-digit differences, on the mixed error |a − n| / max(1, |n|).
    // The tape's own rounding is ~1e-48; the differences' error is bounded above; 1e-25 leaves
    // margin of several decades on both sides while any wrong formula misses by far more.
    double mp_tolerance = 1e-25;

    // Double tape against 50-digit differences (same mixed error). A double gradient carries
    // rounding of about n·u·κ (u = 1.1e-16, n terms per coordinate, κ the conditioning of exp
    // in softmax); for the graphs here n ≤ 1e4 and κ ≤ 1e2, so 1e-10, with a decade of margin.
    double double_tolerance = 1e-9;

    // Fast mode: random unit directions (Gaussian, normalised), seeded; branches likewise.
    std::size_t directions = 3;
    std::uint64_t seed = 20261129;

    bool check_branches = true;   // attribute summed gradients to their branches
    bool check_consistency = true;  // backward twice, zero seed
    unsigned threads = 2;         // coordinates are spread over this many threads
    std::size_t max_reported = 5;  // worst mismatches kept in the report
};

// One coordinate (or one direction) whose analytic and numeric derivatives disagree.
struct Mismatch {
    std::string leaf;     // leaf name, or "direction k" in fast mode
    std::string index;    // "(i, j)"
    std::string branch;   // the consumer, for a branch check; empty for a whole gradient
    std::string source;   // "double tape", "50-digit tape", or "step agreement"
    double analytic = 0;  // the tape's value (or, for step agreement, the difference at steps[0])
    double numeric = 0;   // the 50-digit central difference
    double step = 0;
    double abs_error = 0;
    double rel_error = 0;  // |a − n| / max(1, |n|), the quantity compared with the threshold
    double threshold = 0;
};

// Per-branch verdict for a leaf with several consumers.
struct BranchReport {
    std::string leaf;
    std::string consumer;  // e.g. "matmul -> K"
    double max_error_mp = 0;
    std::size_t failures = 0;
};

struct CheckReport {
    bool passed = true;
    std::string mode;           // "full", "fast", or "fast, then full"
    std::uint64_t seed = 0;
    std::size_t coordinates = 0;  // derivatives compared (coordinates, or directions)
    std::size_t failures = 0;     // of those, how many exceed a threshold
    double max_error_double = 0;  // worst mixed error, double tape vs 50-digit differences
    double max_error_mp = 0;      // worst mixed error, 50-digit tape vs 50-digit differences
    double max_step_disagreement = 0;
    std::vector<Mismatch> worst;
    std::vector<BranchReport> branches;
    std::vector<std::string> consistency_failures;
    double seconds = 0;

    // The wrong branches, by consumer name.
    std::vector<std::string> failed_branches() const {
        std::vector<std::string> names;
        for (const BranchReport& b : branches)
            if (b.failures > 0) names.push_back(b.leaf + " via " + b.consumer);
        return names;
    }

    std::string summary() const {
        std::string text = fmt::format(
            "gradcheck {} ({} mode, seed {}): {} of {} derivatives exceed the thresholds; "
            "max error double tape vs 50-digit differences {:.3g}, 50-digit tape vs 50-digit differences {:.3g}, "
            "step agreement {:.3g}; {:.3f} s",
            passed ? "passed" : "FAILED", mode, seed, failures, coordinates, max_error_double, max_error_mp,
            max_step_disagreement, seconds);
        for (const Mismatch& m : worst) {
            text += fmt::format(
                "\n  leaf {} index {}{}: analytic ({}) = {:.17g}, numeric (50-digit central difference, h={:g}) = "
                "{:.17g}, abs error {:.3g}, rel error {:.3g} > threshold {:.0e}",
                m.leaf, m.index, m.branch.empty() ? "" : " branch " + m.branch, m.source, m.analytic, m.step,
                m.numeric, m.abs_error, m.rel_error, m.threshold);
        }
        for (const BranchReport& b : branches) {
            text += fmt::format("\n  branch {} via {}: max error {:.3g}{}", b.leaf, b.consumer, b.max_error_mp,
                                b.failures ? fmt::format(" ({} coordinates wrong)", b.failures) : "");
        }
        for (const std::string& c : consistency_failures) text += "\n  consistency: " + c;
        return text;
    }
};

namespace detail {

// A graph recorded on a tape of scalar type T.
template <Scalar T, std::size_t N>
struct Recording {
    Tape<T> tape;
    std::array<Var<T>, N> leaves;
    Var<T> output;
};

template <Scalar T, std::size_t N, class Graph>
std::unique_ptr<Recording<T, N>> record(Graph& graph, const std::array<const NamedTensor*, N>& leaves) {
    auto recording = std::make_unique<Recording<T, N>>();
    for (std::size_t l = 0; l < N; ++l) {
        recording->leaves[l] = recording->tape.leaf(tensor_cast<T>(leaves[l]->value), leaves[l]->name);
    }
    recording->output = graph(recording->leaves);
    if (recording->output.shape().size() != 1) {
        throw usage_error(fmt::format("gradcheck: the graph must return a scalar J, it returned shape {}",
                                      recording->output.shape().to_string()));
    }
    return recording;
}

// Mixed error: absolute near zero, relative for large values.
inline double mixed_error(const mp50& analytic, const mp50& numeric) {
    using boost::multiprecision::abs;
    const mp50 scale = std::max(mp50(1), mp50(abs(numeric)));
    return to_double(mp50(abs(analytic - numeric) / scale));
}

// Runs work(item, thread) for item in [0, count) on `threads` threads; rethrows the first error.
template <class Work>
void parallel_for(std::size_t count, unsigned threads, Work work) {
    threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(count)));
    std::atomic<std::size_t> next{0};
    std::exception_ptr failure;
    std::mutex failure_mutex;
    auto run = [&](unsigned thread) {
        try {
            for (std::size_t item; (item = next++) < count;) work(item, thread);
        } catch (...) {
            const std::lock_guard lock(failure_mutex);
            if (!failure) failure = std::current_exception();
            next = count;
        }
    };
    {
        std::vector<std::jthread> pool;
        for (unsigned t = 1; t < threads; ++t) pool.emplace_back(run, t);
        run(0);
    }
    if (failure) std::rethrow_exception(failure);
}

// Fills `parts` (already shaped) with one random unit vector: Gaussian draws normalised in double,
// then held exactly in mp50. A unit direction keeps the truncation error h²|D³J[v,v,v]|/6 of a
// directional difference within the same bound as for one coordinate, whatever the size.
inline void random_unit_direction(std::mt19937_64& generator, std::span<Tensor<mp50>> parts) {
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

// Collects errors and the worst mismatches.
class Tally {
public:
    explicit Tally(std::size_t keep) : keep_(keep) {}
    void add(Mismatch m, bool double_side, bool step_side) {
        if (double_side) max_double = std::max(max_double, m.rel_error);
        else if (step_side) max_step = std::max(max_step, m.rel_error);
        else max_mp = std::max(max_mp, m.rel_error);
        if (!(m.rel_error <= m.threshold)) {  // also catches a NaN error
            failed = true;
            // One line per coordinate: keep only its worst disagreement.
            const auto same = std::find_if(worst.begin(), worst.end(), [&](const Mismatch& w) {
                return w.leaf == m.leaf && w.index == m.index && w.branch == m.branch;
            });
            if (same != worst.end()) {
                if (same->rel_error >= m.rel_error) return;
                worst.erase(same);
            }
            worst.push_back(std::move(m));
            std::sort(worst.begin(), worst.end(),
                      [](const Mismatch& a, const Mismatch& b) { return a.rel_error > b.rel_error; });
            if (worst.size() > keep_) worst.pop_back();
        }
    }
    double max_double = 0, max_mp = 0, max_step = 0;
    bool failed = false;
    std::vector<Mismatch> worst;

private:
    std::size_t keep_;
};

}  // namespace detail

// A gradient source other than the tape: a hand-derived backward (the spec's `backward`),
// written as a generic lambda from the leaves' values to their gradients.
struct TapeGradients {};

// Checks the gradients of `graph` with respect to each leaf. See the top of this file.
// `hand_gradients` (optional) replaces the tape's gradients with a hand-derived backward.
template <std::size_t N, class Graph, class HandGradients = TapeGradients>
CheckReport check_gradients(Graph&& graph, const NamedTensor (&leaves)[N], const CheckOptions& options = {},
                            HandGradients hand_gradients = {}) {
    constexpr bool from_tape = std::is_same_v<HandGradients, TapeGradients>;
    const auto start = std::chrono::steady_clock::now();
    std::array<const NamedTensor*, N> leaf_list{};
    for (std::size_t l = 0; l < N; ++l) {
        leaf_list[l] = &leaves[l];
        const Tensor<double>& value = leaves[l].value;
        if (value.size() == 0) throw shape_error(fmt::format("gradcheck: leaf {} is empty", leaves[l].name));
        for (std::size_t k = 0; k < value.size(); ++k) {
            if (!is_finite(value[k])) {
                throw value_error(fmt::format("gradcheck: leaf {} has the non-finite value {} at {}", leaves[l].name,
                                              value[k], index_string(value.shape(), k)));
            }
        }
    }

    CheckReport report;
    report.seed = options.seed;

    // Both precisions must agree on whether the graph is defined at these inputs.
    std::unique_ptr<detail::Recording<double, N>> in_double;
    std::unique_ptr<detail::Recording<mp50, N>> in_mp;
    std::exception_ptr double_error, mp_error;
    try {
        in_double = detail::record<double, N>(graph, leaf_list);
    } catch (...) {
        double_error = std::current_exception();
    }
    try {
        in_mp = detail::record<mp50, N>(graph, leaf_list);
    } catch (...) {
        mp_error = std::current_exception();
    }
    if (double_error && mp_error) std::rethrow_exception(double_error);
    if (double_error || mp_error) {
        report.passed = false;
        report.mode = "consistency";
        const std::exception_ptr thrown = double_error ? double_error : mp_error;
        std::string what;
        try {
            std::rethrow_exception(thrown);
        } catch (const std::exception& e) {
            what = e.what();
        }
        report.consistency_failures.push_back(fmt::format("the {} forward threw ({}) but the {} forward did not",
                                                          double_error ? "double" : "50-digit", what,
                                                          double_error ? "50-digit" : "double"));
        return report;
    }

    // Analytic gradients in both precisions.
    std::array<Tensor<double>, N> grad_double;
    std::array<Tensor<mp50>, N> grad_mp;
    if constexpr (from_tape) {
        Tape<double>& tape = in_double->tape;
        tape.backward(in_double->output);
        for (std::size_t l = 0; l < N; ++l) grad_double[l] = in_double->leaves[l].grad();
        if (options.check_consistency) {
            tape.zero_grad();
            tape.backward(in_double->output);
            for (std::size_t l = 0; l < N; ++l) {
                if (!(in_double->leaves[l].grad() == grad_double[l])) {
                    report.consistency_failures.push_back(
                        fmt::format("backward run twice gave different gradients for {}", leaves[l].name));
                }
            }
            tape.zero_grad();
            tape.backward(in_double->output, Tensor<double>(in_double->output.shape(), 0.0));
            for (std::size_t l = 0; l < N; ++l) {
                const auto g = in_double->leaves[l].grad().data();
                if (std::any_of(g.begin(), g.end(), [](double x) { return x != 0.0; })) {
                    report.consistency_failures.push_back(
                        fmt::format("a zero upstream gradient gave a non-zero gradient for {}", leaves[l].name));
                }
            }
        }
        in_mp->tape.log_branches(options.check_branches);
        in_mp->tape.backward(in_mp->output);
        for (std::size_t l = 0; l < N; ++l) grad_mp[l] = in_mp->leaves[l].grad();
    } else {
        std::array<Tensor<double>, N> values_double;
        std::array<Tensor<mp50>, N> values_mp;
        for (std::size_t l = 0; l < N; ++l) {
            values_double[l] = leaves[l].value;
            values_mp[l] = tensor_cast<mp50>(leaves[l].value);
        }
        grad_double = hand_gradients(values_double);
        grad_mp = hand_gradients(values_mp);
        for (std::size_t l = 0; l < N; ++l) {
            if (!(grad_double[l].shape() == leaves[l].value.shape()) || !(grad_mp[l].shape() == leaves[l].value.shape())) {
                throw shape_error(fmt::format("gradcheck: the hand-derived gradient of {} has shape {}, the leaf {}",
                                              leaves[l].name, grad_double[l].shape().to_string(),
                                              leaves[l].value.shape().to_string()));
            }
        }
    }

    const Tape<mp50>& tape = in_mp->tape;
    const Var<mp50> output = in_mp->output;
    const unsigned threads = options.threads == 0 ? std::max(1u, std::thread::hardware_concurrency()) : options.threads;
    std::vector<ReplayWorkspace<mp50>> workspaces(threads);
    using Replacement = typename Tape<mp50>::Replacement;

    // Central differences of J along `direction` (a set of leaf replacements built by `perturb`).
    auto central_difference = [&](auto&& replacements_at, unsigned thread, const mp50& h) {
        const mp50 plus = tape.replay(output, replacements_at(h), workspaces[thread]).item();
        const mp50 minus = tape.replay(output, replacements_at(mp50(-h)), workspaces[thread]).item();
        return mp50((plus - minus) / (2 * h));
    };

    detail::Tally tally(options.max_reported);
    struct Verdict {
        bool ok = true;
        double mp_error = 0;
    };
    auto compare = [&](const std::string& leaf, const std::string& index, const std::string& branch,
                       const mp50& analytic_mp, const std::optional<double>& analytic_double,
                       const std::array<mp50, 2>& numeric) {
        using boost::multiprecision::abs;
        std::vector<std::pair<Mismatch, int>> found;  // side: 0 mp, 1 double, 2 steps
        for (std::size_t s = 0; s < 2; ++s) {
            const mp50& n = numeric[s];
            Mismatch m{leaf, index, branch, "50-digit tape", to_double(analytic_mp), to_double(n), options.steps[s],
                       to_double(mp50(abs(analytic_mp - n))), detail::mixed_error(analytic_mp, n), options.mp_tolerance};
            found.emplace_back(m, 0);
            if (analytic_double) {
                const mp50 a(*analytic_double);
                found.emplace_back(Mismatch{leaf, index, branch, "double tape", *analytic_double, to_double(n),
                                            options.steps[s], to_double(mp50(abs(a - n))), detail::mixed_error(a, n),
                                            options.double_tolerance},
                                   1);
            }
        }
        found.emplace_back(Mismatch{leaf, index, branch, "step agreement", to_double(numeric[0]), to_double(numeric[1]),
                                    options.steps[1], to_double(mp50(abs(numeric[0] - numeric[1]))),
                                    detail::mixed_error(numeric[0], numeric[1]), options.mp_tolerance},
                           2);
        Verdict verdict;
        for (auto& [m, side] : found) {
            verdict.ok = verdict.ok && (m.rel_error <= m.threshold);
            if (side == 0) verdict.mp_error = std::max(verdict.mp_error, m.rel_error);
            tally.add(std::move(m), side == 1, side == 2);
        }
        return verdict;
    };

    // Fast mode: <∇J, v> against the directional difference, for a few random directions.
    bool run_full = options.mode == CheckOptions::Mode::full;
    if (options.mode == CheckOptions::Mode::fast) {
        report.mode = "fast";
        std::mt19937_64 generator(options.seed);
        bool all_ok = true;
        for (std::size_t k = 0; k < options.directions; ++k) {
            std::array<Tensor<mp50>, N> direction;
            for (std::size_t l = 0; l < N; ++l) direction[l] = Tensor<mp50>(leaves[l].value.shape());
            detail::random_unit_direction(generator, direction);
            mp50 analytic_mp(0), analytic_double(0);
            for (std::size_t l = 0; l < N; ++l) {
                for (std::size_t c = 0; c < direction[l].size(); ++c) {
                    analytic_mp += grad_mp[l][c] * direction[l][c];
                    analytic_double += mp50(grad_double[l][c]) * direction[l][c];
                }
            }
            std::array<Tensor<mp50>, N> moved;
            std::array<Replacement, N> replacements;
            auto replacements_at = [&](const mp50& h) {
                for (std::size_t l = 0; l < N; ++l) {
                    moved[l] = in_mp->leaves[l].value();
                    for (std::size_t c = 0; c < moved[l].size(); ++c) moved[l][c] += h * direction[l][c];
                    replacements[l] = Replacement{in_mp->leaves[l], &moved[l], std::nullopt};
                }
                return std::span<const Replacement>(replacements);
            };
            std::array<mp50, 2> numeric;
            for (std::size_t s = 0; s < 2; ++s) numeric[s] = central_difference(replacements_at, 0, mp50(options.steps[s]));
            ++report.coordinates;
            // The double side is compared through the mp sum of its products (exact for the inputs).
            const bool ok = compare(fmt::format("direction {}", k), "(all leaves)", "", analytic_mp,
                                    to_double(analytic_double), numeric)
                                .ok;
            if (!ok) {
                ++report.failures;
                all_ok = false;
            }
        }
        if (!all_ok) {
            report.mode = "fast, then full";
            run_full = true;
            tally = detail::Tally(options.max_reported);
            report.coordinates = report.failures = 0;
        }
    }

    if (run_full) {
        if (report.mode.empty()) report.mode = "full";
        // Every coordinate of every leaf, perturbed on its own.
        struct Item {
            std::size_t leaf, coordinate;
        };
        std::vector<Item> items;
        for (std::size_t l = 0; l < N; ++l)
            for (std::size_t c = 0; c < leaves[l].value.size(); ++c) items.push_back({l, c});
        std::vector<std::array<mp50, 2>> numeric(items.size());
        std::vector<std::vector<Tensor<mp50>>> perturbed(threads, std::vector<Tensor<mp50>>(N));
        detail::parallel_for(items.size(), threads, [&](std::size_t i, unsigned thread) {
            const Item item = items[i];
            Tensor<mp50>& moved = perturbed[thread][item.leaf];
            if (moved.size() == 0) moved = in_mp->leaves[item.leaf].value();
            const mp50 x = moved[item.coordinate];
            Replacement replacement{in_mp->leaves[item.leaf], &moved, std::nullopt};
            auto replacements_at = [&](const mp50& h) {
                moved[item.coordinate] = x + h;
                return std::span<const Replacement>(&replacement, 1);
            };
            for (std::size_t s = 0; s < 2; ++s) numeric[i][s] = central_difference(replacements_at, thread, mp50(options.steps[s]));
            moved[item.coordinate] = x;
        });
        for (std::size_t i = 0; i < items.size(); ++i) {
            const Item item = items[i];
            const Shape& shape = leaves[item.leaf].value.shape();
            ++report.coordinates;
            if (!compare(leaves[item.leaf].name, index_string(shape, item.coordinate), "",
                         grad_mp[item.leaf][item.coordinate], grad_double[item.leaf][item.coordinate], numeric[i])
                     .ok) {
                ++report.failures;
            }
        }
    }

    // Branch attribution: a leaf with several consumers, each branch on its own.
    if constexpr (from_tape) {
        if (options.check_branches) {
            for (std::size_t l = 0; l < N; ++l) {
                const Var<mp50>& leaf = in_mp->leaves[l];
                const auto edges = tape.consumers(leaf);
                if (edges.size() < 2) continue;
                Tensor<mp50> branch_sum(leaf.shape());
                for (const auto& edge : edges) {
                    // The tape's contribution along this edge (zero when the branch does not reach J).
                    Tensor<mp50> analytic(leaf.shape());
                    for (const Branch<mp50>& b : tape.branches()) {
                        if (b.consumer == edge.consumer && b.slot == edge.slot && b.target == leaf.index()) {
                            for (std::size_t c = 0; c < analytic.size(); ++c) analytic[c] += b.contribution[c];
                        }
                    }
                    for (std::size_t c = 0; c < analytic.size(); ++c) branch_sum[c] += analytic[c];
                    const NodeInfo consumer = tape.info(edge.consumer);
                    BranchReport branch{leaves[l].name,
                                        fmt::format("{} -> {} (input {})", consumer.op,
                                                    consumer.label.empty() ? fmt::format("node {}", edge.consumer)
                                                                           : std::string(consumer.label),
                                                    edge.slot)};
                    // Fast mode (when it passed): the branch along a few unit directions over the
                    // leaf; the coordinates only when one of them disagrees.
                    bool coordinates_needed = run_full;
                    if (!run_full) {
                        std::mt19937_64 generator(options.seed + 7919 * (edge.consumer + 1) + edge.slot);
                        Tensor<mp50> direction(leaf.shape()), moved(leaf.shape());
                        for (std::size_t k = 0; k < options.directions && !coordinates_needed; ++k) {
                            detail::random_unit_direction(generator, std::span(&direction, 1));
                            mp50 along(0);
                            for (std::size_t c = 0; c < direction.size(); ++c) along += analytic[c] * direction[c];
                            Replacement replacement{leaf, &moved, edge};
                            auto replacements_at = [&](const mp50& h) {
                                for (std::size_t c = 0; c < moved.size(); ++c) moved[c] = leaf.value()[c] + h * direction[c];
                                return std::span<const Replacement>(&replacement, 1);
                            };
                            std::array<mp50, 2> numeric;
                            for (std::size_t s = 0; s < 2; ++s) numeric[s] = central_difference(replacements_at, 0, mp50(options.steps[s]));
                            const Verdict verdict = compare(leaves[l].name, fmt::format("(direction {})", k),
                                                            branch.consumer, along, std::nullopt, numeric);
                            branch.max_error_mp = std::max(branch.max_error_mp, verdict.mp_error);
                            coordinates_needed = !verdict.ok;
                        }
                    }
                    if (coordinates_needed) {
                        std::vector<std::array<mp50, 2>> numeric(analytic.size());
                        std::vector<Tensor<mp50>> moved(threads, leaf.value());
                        detail::parallel_for(analytic.size(), threads, [&](std::size_t c, unsigned thread) {
                            const mp50 x = moved[thread][c];
                            Replacement replacement{leaf, &moved[thread], edge};
                            auto replacements_at = [&](const mp50& h) {
                                moved[thread][c] = x + h;
                                return std::span<const Replacement>(&replacement, 1);
                            };
                            for (std::size_t s = 0; s < 2; ++s) numeric[c][s] = central_difference(replacements_at, thread, mp50(options.steps[s]));
                            moved[thread][c] = x;
                        });
                        for (std::size_t c = 0; c < analytic.size(); ++c) {
                            const Verdict verdict = compare(leaves[l].name, index_string(leaf.shape(), c),
                                                            branch.consumer, analytic[c], std::nullopt, numeric[c]);
                            branch.max_error_mp = std::max(branch.max_error_mp, verdict.mp_error);
                            if (!verdict.ok) ++branch.failures;
                    }
                    }
                    report.branches.push_back(std::move(branch));
                }
                // The branches must add up to the whole gradient (the tape's accumulate step).
                for (std::size_t c = 0; c < branch_sum.size(); ++c) {
                    if (detail::mixed_error(branch_sum[c], grad_mp[l][c]) > options.mp_tolerance) {
                        report.consistency_failures.push_back(fmt::format(
                            "the branches of {} do not add up to its gradient at {}", leaves[l].name,
                            index_string(leaf.shape(), c)));
                        break;
                    }
                }
            }
        }
    }

    report.max_error_double = tally.max_double;
    report.max_error_mp = tally.max_mp;
    report.max_step_disagreement = tally.max_step;
    report.worst = std::move(tally.worst);
    report.passed = !tally.failed && report.consistency_failures.empty();
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return report;
}

}  // namespace tapegrad
