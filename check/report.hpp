/// \file
/// What the gradient checker is asked to do and what it answers: CheckOptions (mode, steps,
/// thresholds and why they are what they are), and CheckReport with its mismatches, coordinates
/// at kinks, branch verdicts, consistency failures and the one-paragraph summary() that tools and
/// tests print.
/// The checking itself is in check/gradcheck.hpp; the second-order checks' SecondOrderReport is here
/// too, so that check/recorded.hpp needs nothing of the checker's templates.
#pragma once

#include <fmt/core.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace tapegrad {

/// How far a check has come, for a progress display: the finite differences of one stage taken
/// by this process so far, of those it takes, and of all processes' (they differ only when the
/// check is spread over MPI ranks, check/distributed.hpp), and the seconds the stage has run.
struct CheckProgress {
    std::string_view stage;  ///< "full check", "fast check", "branch X via matmul -> Q (input 0)"
    std::size_t done = 0;
    std::size_t mine = 0;
    std::size_t all = 0;
    double seconds = 0;
};

struct CheckOptions {
    enum class Mode { full, fast };
    Mode mode = Mode::full;

    /// Steps of the 50-digit central difference (J(x+h) − J(x−h)) / 2h. Its error is the truncation
    /// term h²|J'''|/6 plus rounding ≈ ε|J|/h with ε ≈ 5e-51 (168-bit significand):
    ///   h = 1e-14: ≤ 1.7e-29·|J'''| + 5e-37·|J|;   h = 1e-16: ≤ 1.7e-33·|J'''| + 5e-35·|J|.
    /// Both are far below mp_tolerance for |J'''| up to 1e3 and |J| up to 1e9. Two steps two
    /// decades apart must agree with each other too: that confirms the differences converged.
    std::array<double, 2> steps{1e-14, 1e-16};

    /// 50-digit tape against 50-digit differences, on the mixed error |a − n| / max(1, |n|).
    /// The tape's own rounding is ~1e-48; the differences' error is bounded above; 1e-25 leaves
    /// margin of several decades on both sides while any wrong formula misses by far more.
    double mp_tolerance = 1e-25;

    /// Double tape against 50-digit differences (same mixed error). A double gradient carries
    /// rounding of about n·u·κ (u = 1.1e-16, n terms per coordinate, κ the conditioning of exp
    /// in softmax); for the graphs here n ≤ 1e4 and κ ≤ 1e2, so 1e-10, with a decade of margin.
    double double_tolerance = 1e-9;

    /// Kinks. Where J is not differentiable at the point checked (abs at 0, relu at 0, clamp at a
    /// bound, max at a tie) no analytic value can match "the" derivative, so such a coordinate (or
    /// direction) is reported as AT A KINK: neither a pass nor a failure. It is found from the
    /// one-sided 50-digit differences right = (J(x+h) − J(x)) / h and left = (J(x) − J(x−h)) / h,
    /// which come with the central ones at no extra cost (J(x) is the recorded output). For a
    /// smooth J, right − left = h·J''(x) + O(h³) plus rounding ≈ 2ε|J|/h: at most 1e-11 at h = 1e-14
    /// and 1e-13 at h = 1e-16 for |J''| ≤ 1e3 and |J| ≤ 1e9. At a kink it is the jump of the
    /// derivative, whatever h. A coordinate is at a kink when, on the mixed measure
    /// |right − left| / max(1, |left|), the two sides part by more than `kink_threshold` at BOTH
    /// steps, and each side agrees with itself across the two steps within it (they converged to
    /// one-sided derivatives). 1e-8 is three decades above the smooth bound at the larger step and
    /// five at the smaller, so a smooth J would need |J''| > 1e8·max(1, |J'|) to be misread; it is
    /// far below any jump an op makes (abs: 2, relu and clamp: 1, times the upstream gradient). A
    /// jump below it is not a kink: the central difference then differs from either one-sided
    /// derivative by up to half the jump, and a mismatch is a failure as usual. A coordinate whose
    /// two sides agree is compared as usual, so a wrong VJP at a smooth point still fails. A kink
    /// is counted and listed in the report, kept out of the failures and the max errors, and does
    /// not fail the check, as long as the analytic value lies between the two one-sided
    /// derivatives (within this same threshold, above their h·|J''| error): any value there is a
    /// valid subgradient along the coordinate, one outside is a failure whatever the convention; a fast-mode direction at a kink sends the check to full mode, which
    /// classifies each coordinate.
    double kink_threshold = 1e-8;

    /// Fast mode: random unit directions (Gaussian, normalised), seeded; branches likewise.
    std::size_t directions = 3;
    std::uint64_t seed = 20261129;

    bool check_branches = true;     ///< attribute summed gradients to their branches
    bool check_consistency = true;  ///< backward twice, zero seed
    std::size_t max_reported = 5;   ///< worst mismatches kept in the report
    /// Called after finite differences this process takes, from one thread at a time (the first
    /// thread of the checker's parallel_for, the caller); the last call of each stage counts all of
    /// this process's share (done == mine), whichever thread took the last one. Empty: no progress
    /// is reported. It reports and changes nothing, so the report does not depend on it.
    std::function<void(const CheckProgress&)> progress{};
    // Threads: the library's one setting, tapegrad::set_threads (autodiff/parallel.hpp).
};

/// What an analytic derivative was compared with the 50-digit differences from: the 50-digit
/// tape, the double tape, or (step agreement) the difference at steps[0] against the one at
/// steps[1]; at a kink, the 50-digit tape against the nearer one-sided difference (its value lies
/// outside both).
enum class Source { mp_tape, double_tape, step_agreement, mp_tape_at_kink };

/// The words the report prints for each source.
constexpr std::string_view to_string(Source source) {
    switch (source) {
        case Source::mp_tape: return "50-digit tape";
        case Source::double_tape: return "double tape";
        case Source::step_agreement: return "step agreement";
        case Source::mp_tape_at_kink: return "50-digit tape at a kink";
    }
    return "unknown source";
}

/// The check that ran: what was asked for, or the full check after a fast one disagreed, or only
/// the consistency check when just one precision could evaluate the graph.
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

/// Streamed as their report words, so test frameworks and logs can print them.
/// For Boost.Test's messages (compiled in the library, src/check/report.cpp, so that this header
/// needs only `<iosfwd>`).
std::ostream& operator<<(std::ostream& out, Source source);
std::ostream& operator<<(std::ostream& out, CheckMode mode);

/// One coordinate (or one direction) whose analytic and numeric derivatives disagree.
struct Mismatch {
    std::string leaf;     ///< leaf name, or "direction k" in fast mode
    std::string index;    ///< "(i, j)"
    std::string branch;   ///< the consumer, for a branch check; empty for a whole gradient
    Source source = Source::mp_tape;
    double analytic = 0;  ///< the tape's value (or, for step agreement, the difference at steps[0])
    double numeric = 0;   ///< the 50-digit central difference
    double step = 0;
    double abs_error = 0;
    double rel_error = 0;  ///< |a − n| / max(1, |n|), the quantity compared with the threshold
    double threshold = 0;
};

/// One coordinate (or branch coordinate) at which J is not differentiable: its one-sided 50-digit
/// differences, taken at steps[1], part by more than CheckOptions::kink_threshold. Neither a pass
/// nor a failure.
struct Kink {
    std::string leaf;    ///< leaf name
    std::string index;   ///< "(i, j)"
    std::string branch;  ///< the consumer, for a branch check; empty for a whole gradient
    double left = 0;     ///< (J(x) − J(x−h)) / h
    double right = 0;    ///< (J(x+h) − J(x)) / h
    double analytic = 0;  ///< the 50-digit tape's value
};

/// Per-branch verdict for a leaf with several consumers.
struct BranchReport {
    std::string leaf;
    std::string consumer;  ///< e.g. "matmul -> K"
    double max_error_mp = 0;
    std::size_t failures = 0;
    std::size_t kinks = 0;  ///< coordinates of this branch at kinks (not failures)
};

/// A node of a recorded tape whose re-run at 50 digits takes another data-dependent branch than the
/// recording took (check/recorded.hpp): a relu or abs input of another sign, another region of a
/// clamp, another argmax of a max. The gradients there are of different functions, so a check that
/// fails at such a node says why; one that passes says it anyway.
struct BranchChange {
    std::size_t node = 0;
    std::string op;        ///< "relu"
    std::string label;     ///< the node's label ("" when unnamed)
    std::size_t elements = 0;  ///< output elements that took another branch
    std::size_t of = 0;        ///< of the node's output elements
    std::string first;         ///< the first of them, "(0, 2)"
    double recorded = 0;       ///< its input (relu, abs, clamp) or its maximum (max), as recorded
    double precise = 0;        ///< the same at 50 digits
};

/// A Tape<float>'s own gradient of one leaf, as the program computed it in float (backward(J) on the
/// recorded tape), against the 50-digit gradient of the same recorded function (check/recorded.hpp).
/// The bound comes from the audit's rounding model: `estimate` is estimate_precision's spread of
/// the leaf's gradient over 8 runs of the tape with each node's results randomly rounded in their
/// last place (check/audit.hpp), the size of the error a float backward of this graph carries. A
/// correct float path lands within a few such spreads of the truth (a random-rounding spread is a
/// standard deviation; its runs see rounding between ops, not inside one, which may add a modest
/// factor); the threshold takes 100 times the larger of the spread and float's unit roundoff
/// u = 2^-24, so a float-only fault of 1e-4 relative or more is refused on any graph whose spread is
/// below 1e-6, while a correct gradient is 10-30 spreads inside it.
struct FloatGradientCheck {
    std::string leaf;
    double error = 0;     ///< normwise: ‖g_float − g_50‖₂ / ‖g_50‖₂ (absolute where g_50 = 0)
    double estimate = 0;  ///< the random-rounding spread of the float gradient (normwise)
    double threshold = 0; ///< 100 · max(estimate, 2^-24)
    bool passed = true;
};

struct CheckReport {
    bool passed = true;
    CheckMode mode = CheckMode::full;
    std::uint64_t seed = 0;
    std::size_t coordinates = 0;  ///< derivatives compared (coordinates, or directions)
    std::size_t failures = 0;     ///< of those, how many exceed a threshold
    std::size_t kinks = 0;        ///< of those, how many are at kinks (neither passes nor failures)
    double max_error_double = 0;  ///< worst mixed error, double tape vs 50-digit differences (kinks excluded)
    double max_error_mp = 0;      ///< worst mixed error, 50-digit tape vs 50-digit differences (kinks excluded)
    double max_step_disagreement = 0;
    std::vector<Mismatch> worst;
    std::vector<Kink> first_kinks;  ///< the first max_reported kinks, whole gradients before branches
    std::vector<BranchReport> branches;
    std::vector<std::string> consistency_failures;
    std::vector<BranchChange> branch_changes;  ///< a recorded tape's nodes (check/recorded.hpp)
    /// A recorded Tape<float> whose gradients are J's: each leaf's float gradient against the truth
    /// (a failure here fails the report). Empty for a double tape, a graph function, or a float
    /// tape on which backward(J) has not run.
    std::vector<FloatGradientCheck> float_gradients;
    double seconds = 0;

    /// The wrong branches, by consumer name.
    std::vector<std::string> failed_branches() const {
        std::vector<std::string> names;
        for (const BranchReport& b : branches)
            if (b.failures > 0) names.push_back(b.leaf + " via " + b.consumer);
        return names;
    }

    /// Without kinks, the text is exactly what it was before kinks were classified (tools and
    /// tests read it); kinks add a clause to the first line and a line each. Compiled in the
    /// library (src/check/report.cpp).
    std::string summary() const;
};

/// The second-order checks' report (check/second_order.hpp): one derivative whose analytic and
/// numeric values disagree.
struct SecondOrderMismatch {
    std::string where;     ///< "direction 1, output Y index (0, 2)", "direction 1, leaf W index (1, 0)"
    std::string analytic_label;  ///< "JVP, 50-digit dual tape"
    std::string numeric_label;   ///< "50-digit central difference of Y along t, h=1e-14"
    double analytic = 0;
    double numeric = 0;
    double rel_error = 0;  ///< |a − n| / max(1, |n|)
    double threshold = 0;
};

struct SecondOrderReport {
    std::string check;  ///< "jvp" or "hvp"
    bool passed = true;
    std::uint64_t seed = 0;
    std::size_t directions = 0;
    /// Comparisons made: each entry of J·t or H·v once per direction, step and precision, and (jvp)
    /// the transpose identity once per direction.
    std::size_t compared = 0;
    std::size_t failures = 0;
    double max_error_mp = 0;      ///< 50-digit dual tape vs 50-digit differences
    double max_error_double = 0;  ///< double dual tape vs 50-digit differences (0 when not run)
    double max_step_disagreement = 0;
    double max_transpose_error = 0;  ///< ⟨u, J·t⟩ vs ⟨Jᵀ·u, t⟩ (jvp only)
    std::vector<SecondOrderMismatch> worst;
    double seconds = 0;

    std::string summary() const;
};

/// Which dual tapes a check compares with the differences: the 50-digit one always; the double one
/// too unless told otherwise (the op tables skip it: each precision instantiates every op of the
/// graph once more, and the compile time of the tables is what that costs).
enum class DualTapes { mp_and_double, mp_only };

}  // namespace tapegrad
