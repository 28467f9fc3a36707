// The check reports' text (check/report.hpp), compiled once in the library: CheckReport::summary()
// formats a dozen numbers per line with fmt, which cost every program that printed a report
// (the quickstart among them) a tenth of its compile time when it was inline.
#include "check/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <ostream>

namespace tapegrad {

namespace {

// "2 coordinates at kinks" followed by `then`; nothing at all for none.
std::string kinks_clause(std::size_t count, std::string_view then) {
    if (count == 0) return "";
    return fmt::format("{} {}{}", count, count == 1 ? "coordinate at a kink" : "coordinates at kinks", then);
}

// "1 of 2 float32 gradients as computed beyond their bounds; " for a float tape's own gradients.
std::string float_clause(const std::vector<FloatGradientCheck>& checks) {
    if (checks.empty()) return "";
    const auto beyond =
        std::count_if(checks.begin(), checks.end(), [](const FloatGradientCheck& f) { return !f.passed; });
    return fmt::format("{} of {} float32 gradients as computed beyond their bounds; ", beyond, checks.size());
}

}  // namespace

std::ostream& operator<<(std::ostream& out, Source source) { return out << to_string(source); }
std::ostream& operator<<(std::ostream& out, CheckMode mode) { return out << to_string(mode); }

std::string CheckReport::summary() const {
    std::string text = fmt::format(
        "gradcheck {} ({} mode, seed {}): {} of {} derivatives exceed the thresholds; "
        "max error double tape vs 50-digit differences {:.3g}, 50-digit tape vs 50-digit differences {:.3g}, "
        "step agreement {:.3g}; {}{}{:.3f} s",
        passed ? "passed" : "FAILED", to_string(mode), seed, failures, coordinates, max_error_double, max_error_mp,
        max_step_disagreement, kinks_clause(kinks, "; "), float_clause(float_gradients), seconds);
    for (const Mismatch& m : worst) {
        text += fmt::format(
            "\n  leaf {} index {}{}: analytic ({}) = {:.17g}, numeric (50-digit {} difference, h={:g}) = "
            "{:.17g}, abs error {:.3g}, rel error {:.3g} > threshold {:.0e}",
            m.leaf, m.index, m.branch.empty() ? "" : " branch " + m.branch, to_string(m.source), m.analytic,
            m.source == Source::mp_tape_at_kink ? "nearer one-sided" : "central", m.step, m.numeric, m.abs_error,
            m.rel_error, m.threshold);
    }
    for (const Kink& k : first_kinks) {
        text += fmt::format(
            "\n  leaf {} index {}{}: at a kink: left derivative {:.17g}, right derivative {:.17g}, "
            "analytic {:.17g} (neither pass nor failure)",
            k.leaf, k.index, k.branch.empty() ? "" : " branch " + k.branch, k.left, k.right, k.analytic);
    }
    for (const BranchReport& b : branches) {
        text += fmt::format("\n  branch {} via {}: max error {:.3g}{}{}", b.leaf, b.consumer, b.max_error_mp,
                            b.failures ? fmt::format(" ({} coordinates wrong)", b.failures) : "",
                            b.kinks ? " (" + kinks_clause(b.kinks, "") + ")" : "");
    }
    for (const std::string& c : consistency_failures) text += "\n  consistency: " + c;
    for (const BranchChange& b : branch_changes) {
        text += fmt::format("\n  node {} ({}{}): {} of {} elements take another branch at 50 digits than "
                            "recorded (first at {}: {:.17g} as recorded, {:.17g} at 50 digits)",
                            b.node, b.op, b.label.empty() ? "" : " '" + b.label + "'", b.elements, b.of, b.first,
                            b.recorded, b.precise);
    }
    for (const FloatGradientCheck& f : float_gradients) {
        text += fmt::format("\n  float32 gradient of {} as the tape computed it: error {:.3g} against the 50-digit "
                            "gradient, threshold {:.3g} (100 x its random-rounding spread {:.3g}, at least 100 u){}",
                            f.leaf, f.error, f.threshold, f.estimate, f.passed ? "" : ": FAILED");
    }
    return text;
}

}  // namespace tapegrad
