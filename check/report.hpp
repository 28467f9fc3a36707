// What the gradient checker is asked to do and what it answers: CheckOptions (mode, steps,
// thresholds and why they are what they are), and CheckReport with its mismatches, branch
// verdicts, consistency failures and the one-paragraph summary() that tools and tests print.
// The checking itself is in check/gradcheck.hpp.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

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

    bool check_branches = true;     // attribute summed gradients to their branches
    bool check_consistency = true;  // backward twice, zero seed
    std::size_t max_reported = 5;   // worst mismatches kept in the report
    // Threads: the library's one setting, tapegrad::set_threads (autodiff/parallel.hpp).
};

// What an analytic derivative was compared with the 50-digit differences from: the 50-digit
// tape, the double tape, or (step agreement) the difference at steps[0] against the one at steps[1].
enum class Source { mp_tape, double_tape, step_agreement };

// The words the report prints for each source.
constexpr std::string_view to_string(Source source) {
    switch (source) {
        case Source::mp_tape: return "50-digit tape";
        case Source::double_tape: return "double tape";
        case Source::step_agreement: return "step agreement";
    }
    return "unknown source";
}

// The check that ran: what was asked for, or the full check after a fast one disagreed, or only
// the consistency check when just one precision could evaluate the graph.
enum class CheckMode { full, fast, fast_then_full, consistency };

constexpr std::string_view to_string(CheckMode mode) {
    switch (mode) {
        case CheckMode::full: return "full";
        case CheckMode::fast: return "fast";
        case CheckMode::fast_then_full: return "fast, then full";
        case CheckMode::consistency: return "consistency";
    }
    return "unknown mode";
}

// Streamed as their report words, so test frameworks and logs can print them.
inline std::ostream& operator<<(std::ostream& out, Source source) { return out << to_string(source); }
inline std::ostream& operator<<(std::ostream& out, CheckMode mode) { return out << to_string(mode); }

// One coordinate (or one direction) whose analytic and numeric derivatives disagree.
struct Mismatch {
    std::string leaf;     // leaf name, or "direction k" in fast mode
    std::string index;    // "(i, j)"
    std::string branch;   // the consumer, for a branch check; empty for a whole gradient
    Source source = Source::mp_tape;
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
    CheckMode mode = CheckMode::full;
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
            passed ? "passed" : "FAILED", to_string(mode), seed, failures, coordinates, max_error_double,
            max_error_mp, max_step_disagreement, seconds);
        for (const Mismatch& m : worst) {
            text += fmt::format(
                "\n  leaf {} index {}{}: analytic ({}) = {:.17g}, numeric (50-digit central difference, h={:g}) = "
                "{:.17g}, abs error {:.3g}, rel error {:.3g} > threshold {:.0e}",
                m.leaf, m.index, m.branch.empty() ? "" : " branch " + m.branch, to_string(m.source), m.analytic,
                m.step, m.numeric, m.abs_error, m.rel_error, m.threshold);
        }
        for (const BranchReport& b : branches) {
            text += fmt::format("\n  branch {} via {}: max error {:.3g}{}", b.leaf, b.consumer, b.max_error_mp,
                                b.failures ? fmt::format(" ({} coordinates wrong)", b.failures) : "");
        }
        for (const std::string& c : consistency_failures) text += "\n  consistency: " + c;
        return text;
    }
};

}  // namespace tapegrad
