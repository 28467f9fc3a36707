// Helpers shared by the tests: seeded random tensors, a random probe that turns any output into
// a scalar J = Σ Y ∘ G, and a one-line way to push an op through the generic checker, through
// an explicit upstream seed on its own output, and through the JVP and HVP checks (the op tables).
#pragma once

#include "tapegrad.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <tuple>

namespace tapegrad {

// Boost.Test prints values of failed comparisons through operator<<.
template <Scalar T>
std::ostream& operator<<(std::ostream& out, const Tensor<T>& tensor) {
    return out << fmt::format("{}", tensor);
}

}  // namespace tapegrad

namespace tapegrad::testing {

inline Tensor<double> random_tensor(const Shape& shape, std::mt19937_64& rng, double spread = 1.0) {
    std::uniform_real_distribution<double> uniform(-spread, spread);
    Tensor<double> t(shape);
    for (double& x : t.data()) x = uniform(rng);
    return t;
}

// J = Σ Y ∘ G with a fixed random G (seeded by the shape), so every output coordinate matters
// and no two coordinates of the gradient are forced equal.
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

// The op recorded on `tape`: leaves x0, x1, ... holding `values`, and its output.
template <std::size_t N, class Op>
Var<double> record_op(Op& op, Tape<double>& tape, const std::array<Tensor<double>, N>& values) {
    std::array<Var<double>, N> leaves;
    for (std::size_t l = 0; l < N; ++l) leaves[l] = tape.leaf(values[l], fmt::format("x{}", l));
    return op(leaves);
}

// The recorded graph up to `output` re-run at 50 digits on `precise`, with the leaves' values given.
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

// The op tables' second-order columns: the JVP check on the op's own output Y (every entry, plus
// the transpose identity) and the HVP check on the probe J = Σ Y ∘ G, each along one seeded random
// direction (check/second_order.hpp's checks on the recorded tape: 50-digit and double dual
// tapes against 50-digit differences, thresholds as the checker's). One direction each keeps the
// run time small (the tables also run in the sanitizer build); the attention graphs get three in
// tests/test_second_order.cpp. A failure's report is printed as a warning; the row fails through
// the returned verdict. An output with constant non-finite entries (mask: −inf where hidden) has
// no scalar probe (−inf·G summed over signs of G is NaN), so it gets the JVP column only (J
// invalid); its curvature is checked where softmax follows it ("mask then softmax").
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

// Drives the op recorded as `Y` on `tape` (leaves x0..x(N−1)) by an explicit upstream seed on its
// own output, in 50 digits: a random G over every output entry (hidden and dropped ones included)
// goes through backward(Y, G) on the 50-digit re-run, and each leaf coordinate's VJP is compared
// with the central difference of Σ_k G_k·Y_k, summed over the entries of Y that move (an entry the
// forward holds constant, −inf where mask hides a score or 0 where dropout dropped one,
// contributes nothing). So a VJP that leaks gradient where its output is constant fails here, even
// when a downstream op (softmax after mask) would hide the leak from a scalar loss. Threshold 1e-25
// on the mixed error, as the checker's: the step h = 1e-16 gives a truncation error of about
// h²·|third derivative|/6 ≈ 1e-33 and rounding of about 1e-50/h = 1e-34.
// Each replay is also compared with a fresh re-run of the moved inputs, at the checker's step and
// at a large one (0.25): replays run an op's `update` hook when it has one, and autodiff/op.hpp
// requires it to equal `forward` to rounding. 50-digit results carry ~1e-49 relative rounding and
// the two orders of summation may differ by a few units of that, so 1e-45 is the bound (a wrong
// update misses by about the size of the change, ≥ 1e-20 here).
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
                                                     << ": analytic " << to_double(gradient[c])
                                                     << ", numeric " << to_double(numeric));
            }
        }
    }
    return report;
}

// The seeded check of the op recorded as `Y` on `tape` (leaves holding `values`), with the
// second-order columns on Y and on J, the probe of Y (invalid when Y has non-finite entries);
// their failures are not added to the seeded failure count.
template <std::size_t N>
CheckReport check_seeded_with_second_order(const Tape<double>& tape, const Var<double>& Y, const Var<double>& J,
                                           const std::array<Tensor<double>, N>& values, std::mt19937_64& rng) {
    CheckReport report = check_seeded_on_tape(tape, Y, values, rng);
    const CheckReport second = check_op_second_order(tape, Y, J, rng);
    report.passed = report.passed && second.passed;
    report.max_error_mp = std::max(report.max_error_mp, second.max_error_mp);
    return report;
}

// The seeded check of `op` on given leaf values, with the second-order columns.
template <std::size_t N, class Op>
CheckReport check_op_seeded(Op op, std::mt19937_64& rng, const std::array<Tensor<double>, N>& values) {
    Tape<double> tape;
    const Var<double> Y = record_op(op, tape, values);
    const bool finite = std::all_of(Y.value().data().begin(), Y.value().data().end(),
                                    [](double y) { return std::isfinite(y); });
    return check_seeded_with_second_order(tape, Y, finite ? probe(Y) : Var<double>{}, values, rng);
}

// Checks `op` (a generic lambda from an array of Vars to a Var) on the given leaf values, with the
// default (fixed) thresholds, all on the one tape it is recorded on: through the checker with the
// probe J = Σ Y ∘ G downstream, and by an explicit seed on the op's own output with the JVP and
// HVP columns. Prints the checker's report.
template <std::size_t N, class Op>
CheckReport check_op_on(Op op, std::mt19937_64& rng, const std::array<Tensor<double>, N>& values) {
    Tape<double> tape;
    const Var<double> Y = record_op(op, tape, values);
    const Var<double> J = probe(Y);
    CheckReport report = check_gradients(tape, J);
    BOOST_TEST_MESSAGE(report.summary());
    const CheckReport seeded = check_seeded_with_second_order(tape, Y, J, values, rng);
    report.passed = report.passed && seeded.passed;
    report.max_error_mp = std::max(report.max_error_mp, seeded.max_error_mp);
    return report;
}

// check_op_on with leaves of the given shapes drawn from [−1, 1].
template <class Op, class... Shapes>
CheckReport check_op(Op op, std::mt19937_64& rng, const Shapes&... shapes) {
    const std::array<Tensor<double>, sizeof...(Shapes)> values{random_tensor(shapes, rng)...};
    return check_op_on(op, rng, values);
}

// The seeded check alone, for an op whose output has constant non-finite entries (mask: −inf at
// hidden positions), which no scalar probe can sum.
template <class Op, class... Shapes>
CheckReport check_op_seeded_only(Op op, std::mt19937_64& rng, const Shapes&... shapes) {
    const std::array<Tensor<double>, sizeof...(Shapes)> values{random_tensor(shapes, rng)...};
    return check_op_seeded(op, rng, values);
}

// The message of the `Exception` that f() throws, or a text saying none was thrown (which no
// test's expected words match).
template <class Exception, class F>
std::string message_of(F f) {
    try {
        f();
    } catch (const Exception& e) {
        return e.what();
    }
    return "(no exception of the expected type)";
}

template <class V>
using scalar_of = typename std::decay_t<V>::scalar_type;

// The first fault control (tests/test_fault_controls.cpp; also checked over MPI and as a recorded
// tape): softmax whose VJP keeps only the numerator path, dS = A ∘ G, without − A ∘ rowsum(A ∘ G).
struct SoftmaxWithoutDenominator : Softmax {
    static constexpr std::string_view name = "softmax without denominator path";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dS) {
        for (std::size_t k = 0; k < at.out.size(); ++k) dS[k] = at.out[k] * at.G[k];
    }
};

// The places a report names: its failing coordinates and branches, and the branch verdicts.
using Place = std::tuple<std::string, std::string, std::string>;
inline std::set<Place> failing_places(const CheckReport& r) {
    std::set<Place> places;
    for (const Mismatch& m : r.worst) places.insert({m.leaf, m.index, m.branch});
    return places;
}
inline std::set<Place> branch_verdicts(const CheckReport& r) {
    std::set<Place> verdicts;
    for (const BranchReport& b : r.branches) verdicts.insert({b.leaf, b.consumer, std::to_string(b.failures)});
    return verdicts;
}

// The recorded check and the generic-lambda check of one graph agree: verdict, mode, how many
// derivatives and failures, the coordinates named, the branches and their verdicts. Their double
// tapes are the same computation; their 50-digit functions differ by the double rounding of the
// recorded constants (1/√d: a relative 1.1e-16), which moves the 50-digit differences the double
// errors are measured against by as much (the errors are mixed, relative to max(1, |n|)): the
// double errors agree to 1e-15, ten such roundings.
inline void expect_same_report(const CheckReport& recorded, const CheckReport& generic) {
    BOOST_TEST_MESSAGE("recorded: " << recorded.summary() << "\ngeneric:  " << generic.summary());
    BOOST_TEST(recorded.passed == generic.passed);
    BOOST_TEST(recorded.mode == generic.mode);
    BOOST_TEST(recorded.coordinates == generic.coordinates);
    BOOST_TEST(recorded.failures == generic.failures);
    BOOST_TEST(recorded.kinks == generic.kinks);
    BOOST_TEST((failing_places(recorded) == failing_places(generic)));
    BOOST_TEST((branch_verdicts(recorded) == branch_verdicts(generic)));
    BOOST_TEST(std::abs(recorded.max_error_double - generic.max_error_double) <= 1e-15);
}

// Dimensions an op-table row builds its leaves from (batch, and a matrix chain m×k·k×n).
struct OpDims {
    std::size_t batch, m, k, n;
};

// One row of an op table: the op's name and its check on leaves of the given dimensions.
struct OpCase {
    std::string name;
    std::function<CheckReport(const OpDims&, std::mt19937_64&)> check;
};

// Runs every row of `table` on T = 1, non-square and a few seeded random dimensions (each at most
// `largest`), asserting that the checker passes at its fixed thresholds.
inline void check_op_table(const std::vector<OpCase>& table, std::uint64_t seed, std::size_t largest) {
    std::vector<OpDims> dims = {{1, 1, 1, 1}, {2, 1, 3, 2}, {3, 4, 2, 5}};
    std::mt19937_64 shapes(seed);
    std::uniform_int_distribution<std::size_t> size(1, largest);
    for (int round = 0; round < 2; ++round) dims.push_back({size(shapes), size(shapes), size(shapes), size(shapes)});
    std::mt19937_64 values(seed + 1);
    for (const OpCase& op : table) {
        for (const OpDims& d : dims) {
            BOOST_TEST_CONTEXT(op.name << " batch=" << d.batch << " m=" << d.m << " k=" << d.k << " n=" << d.n) {
                const CheckReport report = op.check(d, values);
                BOOST_TEST(report.passed, report.summary());
                BOOST_TEST(report.max_error_mp <= 1e-25);
            }
        }
    }
}

// Every op struct of the library on one tape (inputs away from every kink, seeded), J its scalar
// output: what the re-run (test_rerun) and the saved tapes (test_tape_file) are proven on. Its op
// names are library_op_names(), the library's op list (ops/instances/siblings.cpp, io/tape_file.cpp).
inline Var<double> every_op_graph(Tape<double>& tape, std::uint64_t seed = 17) {
    std::mt19937_64 rng(seed);
    const auto positive = [&](const Shape& shape) {  // in [0.2, 1.2): away from 0, the kinks and the clamp bounds
        Tensor<double> t = random_tensor(shape, rng, 0.5);
        for (double& x : t.data()) x += 0.7;
        return t;
    };
    const Var<double> X = tape.leaf(positive({2, 4}), "X"), Y = tape.leaf(positive({2, 4}), "Y");
    const Var<double> W = tape.leaf(random_tensor({4, 4}, rng), "W"), E = tape.leaf(random_tensor({5, 4}, rng), "E");
    const Var<double> gain = tape.leaf(positive({4}), "gain"), bias = tape.leaf(random_tensor({4}, rng), "bias");
    const Var<double> keep = tape.constant(Tensor<double>::matrix({{1, 0, 1, 1}, {1, 1, 0, 1}, {0, 1, 1, 1}, {1, 1, 1, 0}}));
    const Var<double> visible = tape.constant(Tensor<double>::matrix({{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 1, 1}}));
    const std::vector<std::size_t> rows{4, 0, 2, 1}, targets{1, 3, 0, 2};

    const Var<double> a = clamp(add(abs(X), Y), -5.0, 5.0);                                  // abs add clamp
    const Var<double> b = concat({a, mul(X, sigmoid(Y))}, 0);                                 // concat mul sigmoid
    const Var<double> c = div(b, shift(exp(scale(b, 0.1)), 1.0));                            // div shift exp scale
    const Var<double> d = layer_norm(gelu(dropout_with_mask(c, keep, 0.5)), gain, bias);     // dropout gelu layer_norm
    const Var<double> e = log_softmax(matmul(d, W));                                          // log_softmax matmul
    const Var<double> f = softmax(mask(e, visible));                                          // softmax mask
    const Var<double> g = add(embedding(E, rows), transpose(f));                             // embedding transpose
    const Var<double> h = merge_heads(permute(permute(split_heads(g, 2), {1, 0, 2}), {1, 0, 2}));  // split permute merge
    const Var<double> q = fused_attention(h, h, tanh(h), true, 0);                            // fused_attention tanh
    const Var<double> r = reshape(slice(q, 0, 1, 3), Shape{4, 2});                            // slice reshape
    const Var<double> s = sqrt(pow(relu(neg(sub(r, shift(scale(r, 2.0), 5.0)))), 2.5));     // sqrt pow relu neg sub (relu of r + 5)
    const Var<double> t = add(reciprocal(s), log(shift(r, 3.0)));                             // reciprocal log
    return add(add(sum(logsumexp(t, 1)), sum(max(t, 0))),                                    // sum logsumexp max
               add(sum(mean(t, 1, true)), add(sum(sum(t, 0)), cross_entropy(e, targets))));  // mean sum_axis cross_entropy
}

// A one-block transformer (width 8, 2 heads, context 4, 6 symbols) with seeded parameters and one
// sequence: what the re-run and saved-tape tests record by ordinary code.
struct SmallTransformer {
    TransformerConfig config = [] {
        TransformerConfig c;
        c.layers = 1, c.width = 8, c.heads = 2, c.context = 4, c.vocabulary = 6;
        return c;
    }();
    std::vector<Tensor<double>> values = [this] {
        std::mt19937_64 rng(7);
        std::vector<Tensor<double>> v;
        for (const Shape& shape : parameter_shapes(config)) v.push_back(random_tensor(shape, rng, 0.5));
        return v;
    }();
    std::vector<std::size_t> tokens{1, 4, 0, 5}, targets{4, 0, 5, 2};
};

inline std::set<std::string> library_op_names() {
    return {"leaf", "abs", "add", "clamp", "concat", "cross_entropy", "div", "dropout", "embedding", "exp",
            "fused_attention", "gelu", "layer_norm", "log", "log_softmax", "logsumexp", "mask", "matmul", "max", "mean",
            "merge_heads", "mul", "neg", "permute", "pow", "reciprocal", "relu", "reshape", "scale", "shift", "sigmoid",
            "slice", "softmax", "split_heads", "sqrt", "sub", "sum", "sum_axis", "tanh", "transpose"};
}

}  // namespace tapegrad::testing
