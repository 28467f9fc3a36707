/// \file
/// tapegrad_testing.hpp: gradient checks inside a Boost.Test suite, the drive tapegrad's own op
/// tables use, for your ops in your tests. Include it after defining BOOST_TEST_MODULE (as for
/// <boost/test/unit_test.hpp>, which it includes); link Boost.Test (Boost::unit_test_framework) and
/// tapegrad::tapegrad.
///
/// * A check as an assertion whose failure message is the checker's report (worst coordinates,
///   branch, seed):
///       BOOST_TEST(tapegrad::testing::passed(tapegrad::check_gradients(graph, leaves)));
///       BOOST_TEST(tapegrad::testing::passed(tapegrad::check_gradients(tape, J)));   // a recorded tape
/// * One line per op and input shape (the op tables): the op recorded on a Tape<double> by a
///   generic lambda from an array of leaves to its output, then checked on that tape through the
///   checker with the probe J = Σ Y ∘ G downstream, by an explicit seed on its own output at 50
///   digits (with every replay compared to a fresh forward), and through the JVP and HVP columns:
///       std::mt19937_64 rng(seed);
///       BOOST_TEST(passed(check_op([](auto x) { return my_ops::softplus(x[0]); }, rng, Shape{3, 4})));
///   check_op_seeded_only for an op whose output holds constant non-finite entries (a mask's −inf).
///   A row also saves the recorded tape and loads it again (round_trips): the op's fields and
///   record must give back the same graph, bit for bit.
/// * The fault-control pattern: a deliberately broken variant of the op must fail where the correct
///   one passes, on the same leaves, so a suite proves it can fail:
///       BOOST_TEST(rejects(correct, broken, rng, Shape{3, 4}));
///
/// A user's op struct is re-run at 50 digits and in the duals through its siblings: register the op
/// once, before the checks (autodiff/registry.hpp: siblings, saving and loading):
///     inline const bool r = tapegrad::register_op<MyOp>();
/// (a deliberately broken variant, checked but never saved, needs only register_siblings<Broken>()).
#pragma once

#include "tapegrad.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

namespace tapegrad::testing {

/// A report as a Boost.Test predicate: true when the check passed, else false with the report's
/// summary (verdict, seed, worst coordinates and branches) as the failure message.
inline boost::test_tools::predicate_result passed(const CheckReport& report) {
    boost::test_tools::predicate_result result(report.passed);
    if (!report.passed) result.message() << "\n" << report.summary();
    return result;
}

inline boost::test_tools::predicate_result passed(const SecondOrderReport& report) {
    boost::test_tools::predicate_result result(report.passed);
    if (!report.passed) result.message() << "\n" << report.summary();
    return result;
}

/// A fault control's report as a predicate: true when the check rejected it.
inline boost::test_tools::predicate_result rejected(const CheckReport& report) {
    boost::test_tools::predicate_result result(!report.passed);
    if (report.passed) {
        result.message() << "\nthe deliberately broken variant passed the check, so this suite could not tell it "
                            "from the correct op:\n"
                         << report.summary();
    }
    return result;
}

inline Tensor<double> random_tensor(const Shape& shape, std::mt19937_64& rng, double spread = 1.0) {
    std::uniform_real_distribution<double> uniform(-spread, spread);
    Tensor<double> t(shape);
    for (double& x : t.data()) x = uniform(rng);
    return t;
}

/// J = Σ Y ∘ G with a fixed random G (seeded by the shape), so every output coordinate matters
/// and no two coordinates of the gradient are forced equal.
template <Scalar T>
Var<T> probe(const Var<T>& Y) {
    if (Y.shape().size() == 1) return sum(Y);
    std::mt19937_64 rng(Y.shape().size() * 7919 + Y.shape().rank());
    const Var<T> G = Y.tape().constant(tensor_cast<T>(random_tensor(Y.shape(), rng)), "G");
    return sum(mul(Y, G));
}

// The op tables drive each op through the tape it was recorded on (check/recorded.hpp): the op
// runs once, on a Tape<double>, by ordinary code; every 50-digit and dual computation is the
// library's re-run of that tape (autodiff/rerun.hpp). So a table compiles its ops at double only;
// an op struct of a test's own (a fault control) registers its siblings to be driven here.

/// The op recorded on `tape`: leaves x0, x1, ... holding `values`, and its output.
template <std::size_t N, class Op>
Var<double> record_op(Op& op, Tape<double>& tape, const std::array<Tensor<double>, N>& values) {
    std::array<Var<double>, N> leaves;
    for (std::size_t l = 0; l < N; ++l) leaves[l] = tape.leaf(values[l], fmt::format("x{}", l));
    return op(leaves);
}

/// The recorded graph up to `output` re-run at 50 digits on `precise`, with the leaves' values given.
template <std::size_t N>
struct AtFiftyDigits {
    std::array<Var<mp50>, N> leaves;
    Var<mp50> output;
};
template <std::size_t N>
AtFiftyDigits<N> rerun_at_50_digits(const Tape<double>& tape, const Var<double>& output, Tape<mp50>& precise,
                                    const std::array<Tensor<mp50>, N>& values) {
    AtFiftyDigits<N> run;
    for (std::size_t l = 0; l < N; ++l) run.leaves[l] = precise.leaf(values[l], fmt::format("x{}", l));
    run.output = rerun(tape, output, std::span<const Var<mp50>>(run.leaves));
    return run;
}

/// The op tables' second-order columns: the JVP check on the op's own output Y (every entry, plus
/// the transpose identity) and the HVP check on the probe J = Σ Y ∘ G, each along one seeded random
/// direction (check/second_order.hpp's checks on the recorded tape: 50-digit and double dual
/// tapes against 50-digit differences, thresholds as the checker's). One direction each keeps the
/// run time small (the tables also run in the sanitizer build); the attention graphs get three in
/// tests/test_second_order.cpp. A failure's report is printed as a warning; the row fails through
/// the returned verdict. An output with constant non-finite entries (mask: −inf where hidden) has
/// no scalar probe (−inf·G summed over signs of G is NaN), so it gets the JVP column only (J
/// invalid); its curvature is checked where softmax follows it ("mask then softmax").
inline CheckReport check_op_second_order(const Tape<double>& tape, const Var<double>& Y, const Var<double>& J,
                                         std::mt19937_64& rng) {
    CheckOptions options;
    options.directions = 1;
    options.seed = rng();
    const SecondOrderReport jvp = check_jvp(tape, Y, options);
    BOOST_WARN_MESSAGE(jvp.passed, jvp.summary());
    CheckReport report;
    report.passed = jvp.passed;
    report.coordinates = jvp.compared;
    report.failures = jvp.failures;
    report.max_error_mp = jvp.max_error_mp;
    if (!J.valid()) return report;
    const SecondOrderReport hvp = check_hvp(tape, J, options);
    BOOST_WARN_MESSAGE(hvp.passed, hvp.summary());
    report.passed = report.passed && hvp.passed;
    report.coordinates += hvp.compared;
    report.failures += hvp.failures;
    report.max_error_mp = std::max(report.max_error_mp, hvp.max_error_mp);
    return report;
}

/// Drives the op recorded as `Y` on `tape` (leaves x0..x(N−1)) by an explicit upstream seed on its
/// own output, in 50 digits: a random G over every output entry (hidden and dropped ones included)
/// goes through backward(Y, G) on the 50-digit re-run, and each leaf coordinate's VJP is compared
/// with the central difference of Σ_k G_k·Y_k, summed over the entries of Y that move (an entry the
/// forward holds constant, −inf where mask hides a score or 0 where dropout dropped one,
/// contributes nothing). So a VJP that leaks gradient where its output is constant fails here, even
/// when a downstream op (softmax after mask) would hide the leak from a scalar loss. Threshold 1e-25
/// on the mixed error, as the checker's: the step h = 1e-16 gives a truncation error of about
/// h²·|third derivative|/6 ≈ 1e-33 and rounding of about 1e-50/h = 1e-34.
/// Each replay is also compared with a fresh re-run of the moved inputs, at the checker's step and
/// at a large one (0.25): replays run an op's `update` hook when it has one, and autodiff/op.hpp
/// requires it to equal `forward` to rounding. 50-digit results carry ~1e-49 relative rounding and
/// the two orders of summation may differ by a few units of that, so 1e-45 is the bound (a wrong
/// update misses by about the size of the change, ≥ 1e-20 here).
template <std::size_t N>
CheckReport check_seeded_on_tape(const Tape<double>& tape, const Var<double>& Y,
                                 const std::array<Tensor<double>, N>& values, std::mt19937_64& rng) {
    CheckReport report;
    std::array<Tensor<mp50>, N> exact;
    for (std::size_t l = 0; l < N; ++l) exact[l] = tensor_cast<mp50>(values[l]);
    Tape<mp50> precise;
    const AtFiftyDigits<N> run = rerun_at_50_digits(tape, Y, precise, exact);
    const Var<mp50>& Y_mp = run.output;
    const Tensor<mp50> G = tensor_cast<mp50>(random_tensor(Y.shape(), rng));
    precise.backward(Y_mp, G);
    ReplayWorkspace<mp50> work;
    const mp50 h(1e-16);
    const auto mixed = [](const mp50& a, const mp50& n) {
        return to_double(mp50(abs(a - n) / std::max(mp50(1), mp50(abs(n)))));
    };
    // Y with coordinate c of leaf l moved by `step`, by replay, checked against a fresh re-run.
    const auto moved_output = [&](std::size_t l, std::size_t c, const mp50& step) {
        std::array<Tensor<mp50>, N> moved = exact;
        moved[l][c] += step;
        const Tape<mp50>::Replacement replacement{run.leaves[l], &moved[l], std::nullopt};
        Tensor<mp50> replayed = precise.replay(Y_mp, std::span(&replacement, 1), work);
        Tape<mp50> fresh;
        const Tensor<mp50> recorded = rerun_at_50_digits(tape, Y, fresh, moved).output.value();
        for (std::size_t k = 0; k < recorded.size(); ++k) {
            const bool same = recorded[k] == replayed[k] || mixed(replayed[k], recorded[k]) <= 1e-45;
            BOOST_TEST(same, "replay of x" << l << " coordinate " << c << " differs from forward at output " << k);
        }
        return replayed;
    };
    for (std::size_t l = 0; l < N; ++l) {
        const Tensor<mp50>& gradient = run.leaves[l].grad();
        for (std::size_t c = 0; c < values[l].size(); ++c) {
            const Tensor<mp50> plus = moved_output(l, c, h), minus = moved_output(l, c, mp50(-h));
            moved_output(l, c, mp50(0.25));
            mp50 numeric(0);
            for (std::size_t k = 0; k < plus.size(); ++k) {
                if (plus[k] != minus[k]) numeric += G[k] * (plus[k] - minus[k]) / (2 * h);
            }
            const double error = mixed(gradient[c], numeric);
            ++report.coordinates;
            report.max_error_mp = std::max(report.max_error_mp, error);
            if (!(error <= 1e-25)) {
                ++report.failures;
                report.passed = false;
                BOOST_TEST_MESSAGE("seeded VJP of x" << l << " at " << index_string(values[l].shape(), c)
                                                     << ": analytic " << to_double(gradient[c]) << ", numeric "
                                                     << to_double(numeric));
            }
        }
    }
    return report;
}

/// The seeded check of the op recorded as `Y` on `tape` (leaves holding `values`), with the
/// second-order columns on Y and on J, the probe of Y (invalid when Y has non-finite entries);
/// their failures are not added to the seeded failure count.
template <std::size_t N>
CheckReport check_seeded_with_second_order(const Tape<double>& tape, const Var<double>& Y, const Var<double>& J,
                                           const std::array<Tensor<double>, N>& values, std::mt19937_64& rng) {
    CheckReport report = check_seeded_on_tape(tape, Y, values, rng);
    const CheckReport second = check_op_second_order(tape, Y, J, rng);
    report.passed = report.passed && second.passed;
    report.max_error_mp = std::max(report.max_error_mp, second.max_error_mp);
    return report;
}

/// The seeded check of `op` on given leaf values, with the second-order columns.
template <std::size_t N, class Op>
CheckReport check_op_seeded(Op op, std::mt19937_64& rng, const std::array<Tensor<double>, N>& values) {
    Tape<double> tape;
    const Var<double> Y = record_op(op, tape, values);
    const bool finite =
        std::all_of(Y.value().data().begin(), Y.value().data().end(), [](double y) { return std::isfinite(y); });
    return check_seeded_with_second_order(tape, Y, finite ? probe(Y) : Var<double>{}, values, rng);
}

/// The saved-tape column: the recorded tape up to J, saved as text and loaded again
/// (io/tape_file.hpp), is the same graph: node for node the same op, settings, inputs, label and
/// value, bit for bit (the loaded ops recorded again through their public functions, from the
/// fields their structs declare). Skipped, with a message naming it, when an op of the tape is not
/// registered for saving (a fault control registered with register_siblings alone).
inline bool round_trips(const Tape<double>& tape, const Var<double>& J) {
    for (std::uint32_t i = 0; i <= J.index(); ++i) {
        const auto node = tape.recorded(i);
        if (node.kind != nullptr && detail::find_saved_op(*node.kind->op) == nullptr) {
            BOOST_TEST_MESSAGE("saved-tape column skipped: op '" << node.kind->name << "' is not registered for saving");
            return true;
        }
    }
    Tape<double> loaded;
    const Var<double> J_loaded = parse_tape(tape_file_text(tape, J), "the op table's tape", loaded);
    bool same = J_loaded.index() == J.index();
    for (std::uint32_t i = 0; same && i <= J.index(); ++i) {
        const NodeInfo a = tape.info(i), b = loaded.info(i);
        const auto& x = tape.recorded(i).value.data();
        const auto& y = loaded.recorded(i).value.data();
        same = a.op == b.op && a.settings == b.settings && a.label == b.label && std::ranges::equal(a.inputs, b.inputs) &&
               x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
        BOOST_TEST(same, "node " << i << " (" << a.op << " " << a.settings << ") differs after saving and loading");
    }
    return same;
}

/// Checks `op` (a generic lambda from an array of Vars to a Var) on the given leaf values, with the
/// default (fixed) thresholds, all on the one tape it is recorded on: through the checker with the
/// probe J = Σ Y ∘ G downstream, by an explicit seed on the op's own output with the JVP and HVP
/// columns, and saved and loaded again (round_trips). Prints the checker's report.
template <std::size_t N, class Op>
CheckReport check_op_on(Op op, std::mt19937_64& rng, const std::array<Tensor<double>, N>& values) {
    Tape<double> tape;
    const Var<double> Y = record_op(op, tape, values);
    const Var<double> J = probe(Y);
    CheckReport report = check_gradients(tape, J);
    BOOST_TEST_MESSAGE(report.summary());
    const CheckReport seeded = check_seeded_with_second_order(tape, Y, J, values, rng);
    report.passed = report.passed && seeded.passed && round_trips(tape, J);
    report.max_error_mp = std::max(report.max_error_mp, seeded.max_error_mp);
    return report;
}

/// check_op_on with leaves of the given shapes drawn from [−1, 1].
template <class Op, class... Shapes>
CheckReport check_op(Op op, std::mt19937_64& rng, const Shapes&... shapes) {
    const std::array<Tensor<double>, sizeof...(Shapes)> values{random_tensor(shapes, rng)...};
    return check_op_on(op, rng, values);
}

/// The seeded check alone, for an op whose output has constant non-finite entries (mask: −inf at
/// hidden positions), which no scalar probe can sum.
template <class Op, class... Shapes>
CheckReport check_op_seeded_only(Op op, std::mt19937_64& rng, const Shapes&... shapes) {
    const std::array<Tensor<double>, sizeof...(Shapes)> values{random_tensor(shapes, rng)...};
    return check_op_seeded(op, rng, values);
}

/// The fault-control pattern in one line: on the same leaves (drawn from [−1, 1] in the given
/// shapes), `correct` passes check_op_on and `broken` fails it. A suite that asserts this has shown
/// that its check can fail.
template <class Correct, class Broken, class... Shapes>
boost::test_tools::predicate_result rejects(Correct correct, Broken broken, std::mt19937_64& rng,
                                            const Shapes&... shapes) {
    const std::array<Tensor<double>, sizeof...(Shapes)> values{random_tensor(shapes, rng)...};
    const CheckReport good = check_op_on(correct, rng, values);
    const CheckReport bad = check_op_on(broken, rng, values);
    boost::test_tools::predicate_result result(good.passed && !bad.passed);
    if (!good.passed) result.message() << "\nthe correct op failed its check:\n" << good.summary();
    if (bad.passed) result.message() << "\nthe broken variant passed its check:\n" << bad.summary();
    return result;
}

}  // namespace tapegrad::testing
