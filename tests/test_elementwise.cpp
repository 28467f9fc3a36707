// The elementwise functions (ops/exp.hpp, log, log1p, sqrt, tanh, sigmoid, abs, pow, clamp): every op
// through the 50-digit checker and an explicit seed on its own output, on inputs inside its domain
// and away from its kinks; values against the std:: functions; stability at large |x|; the
// conventions at kinks and at 0; refused inputs named; and broken VJPs the checker rejects.
#define BOOST_TEST_MODULE elementwise
#include "support.hpp"

#include "ops/abs.hpp"
#include "ops/clamp.hpp"
#include "ops/exp.hpp"
#include "ops/log.hpp"
#include "ops/log1p.hpp"
#include "ops/pow.hpp"
#include "ops/sigmoid.hpp"
#include "ops/sqrt.hpp"
#include "ops/tanh.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <typeinfo>

using namespace tapegrad;
using tapegrad::testing::OpCase;
using tapegrad::testing::OpDims;
using tapegrad::testing::scalar_of;

namespace {

const double inf = std::numeric_limits<double>::infinity();
const double nan = std::numeric_limits<double>::quiet_NaN();

// Where an op-table row draws its leaf values: magnitudes uniform in [low, high], each with a
// random sign when `both_signs`, and none within `kink_margin` of a kink (abs at 0, clamp at its
// bounds) or a pole (pow with p < 0 at 0).
struct Domain {
    double low, high;
    bool both_signs = false;
    std::vector<double> kinks = {};
};

// The checker's differences step at most 1e-14 and the seeded check's 1e-16, so any margin above
// that keeps every central difference on one side of a kink; 0.05 leaves the kink detector of the
// checker, which compares one-sided differences at those steps, nothing to find either.
constexpr double kink_margin = 0.05;

Tensor<double> draw(const Shape& shape, std::mt19937_64& rng, const Domain& domain) {
    std::uniform_real_distribution<double> magnitude(domain.low, domain.high);
    std::bernoulli_distribution negative(0.5);
    const auto near_kink = [&](double x) {
        return std::any_of(domain.kinks.begin(), domain.kinks.end(),
                           [x](double kink) { return std::abs(x - kink) < kink_margin; });
    };
    Tensor<double> values(shape);
    for (double& x : values.data()) {
        do {
            x = magnitude(rng);
            if (domain.both_signs && negative(rng)) x = -x;
        } while (near_kink(x));
    }
    return values;
}

// testing::check_op on leaves drawn from `domain` (check_op draws from [−1, 1], which holds
// values outside log's and sqrt's domains and next to abs's kink): the checker through the probe
// J = Σ Y ∘ G, then the explicit seed on the op's own output, at their fixed thresholds.
template <class Op>
CheckReport check_op_in(Op op, std::mt19937_64& rng, const Domain& domain, const Shape& shape) {
    const std::array<Tensor<double>, 1> values{draw(shape, rng, domain)};
    const CheckReport report = testing::check_op_on(op, rng, values);
    BOOST_TEST_MESSAGE("max_error_mp " << report.max_error_mp << " (checker and seed) on " << shape.to_string());
    return report;
}

// One op-table row: `op` on leaves of shape [m x n] (or [batch x m x n]) drawn from `domain`.
template <class Op>
OpCase row(std::string name, Op op, Domain domain, bool batched = false) {
    return {std::move(name), [op, domain, batched](const OpDims& d, std::mt19937_64& rng) {
                const Shape shape = batched ? Shape{d.batch, d.m, d.n} : Shape{d.m, d.n};
                return check_op_in(op, rng, domain, shape);
            }};
}

// The exponents, in each tape's own precision (1/3 rounded to double would cap the 50-digit tape
// at 16 digits).
template <class V>
scalar_of<V> third() {
    return scalar_of<V>(1) / scalar_of<V>(3);
}

const std::vector<OpCase> op_table = {
    row("exp", [](auto in) { return exp(in[0]); }, {0, 3, true}, true),
    row("log", [](auto in) { return log(in[0]); }, {0.5, 2}),
    row("log1p, both signs", [](auto in) { return log1p(in[0]); }, {0, 0.5, true}),
    row("sqrt", [](auto in) { return sqrt(in[0]); }, {0.5, 2}),
    row("tanh", [](auto in) { return tanh(in[0]); }, {0, 3, true}),
    row("sigmoid", [](auto in) { return sigmoid(in[0]); }, {0, 6, true}),
    row("abs", [](auto in) { return abs(in[0]); }, {0, 2, true, {0}}),
    row("pow 3, both signs", [](auto in) { return pow(in[0], 3); }, {0, 1.5, true}),
    row("pow -2, both signs, away from the pole", [](auto in) { return pow(in[0], -2); }, {0.5, 1.5, true}),
    row("pow 1/3, positive", [](auto in) { return pow(in[0], third<decltype(in[0])>()); }, {0.5, 2}),
    row("pow -1.5, positive", [](auto in) { return pow(in[0], -1.5); }, {0.5, 2}),
    row("clamp [-0.5, 0.75], inside and outside", [](auto in) { return clamp(in[0], -0.5, 0.75); },
        {0, 1.5, true, {-0.5, 0.75}}, true),
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_elementwise_op_passes_the_50_digit_checker) {
    testing::check_op_table(op_table, 2026, 6);
}

namespace {

// A leaf of the given values on `tape`, as a [1 x n] row.
template <Scalar T>
Var<T> row_leaf(Tape<T>& tape, const std::vector<double>& values) {
    return tape.leaf(tensor_cast<T>(Tensor<double>(Shape{1, values.size()}, values)));
}

// The largest relative difference between `computed` and `expected(x)` over the row `xs`.
template <Scalar T>
double worst_relative(const Tensor<T>& computed, const std::vector<double>& xs, const std::function<double(double)>& expected) {
    double worst = 0;
    for (std::size_t k = 0; k < xs.size(); ++k) {
        const double want = expected(xs[k]);
        const double got = to_double(computed[k]);
        worst = std::max(worst, want == got ? 0.0 : std::abs(got - want) / std::abs(want));
    }
    return worst;
}

struct Reference {
    std::string name;
    std::function<Var<double>(const Var<double>&)> in_double;
    std::function<Var<mp50>(const Var<mp50>&)> in_mp;
    std::function<double(double)> expected;
    std::vector<double> xs;
};

const std::vector<double> reals = {-3, -0.7, -1e-3, 0.25, 1.5, 4};
const std::vector<double> positives = {1e-3, 0.25, 1, 1.5, 4, 1e3};

const std::vector<Reference> references = {
    {"exp", [](const auto& x) { return exp(x); }, [](const auto& x) { return exp(x); }, [](double x) { return std::exp(x); }, reals},
    {"log", [](const auto& x) { return log(x); }, [](const auto& x) { return log(x); }, [](double x) { return std::log(x); }, positives},
    {"log1p", [](const auto& x) { return log1p(x); }, [](const auto& x) { return log1p(x); }, [](double x) { return std::log1p(x); },
     {-0.999, -0.7, -1e-12, 1e-300, 1e-10, 0.25, 4, 1e300}},
    {"sqrt", [](const auto& x) { return sqrt(x); }, [](const auto& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, positives},
    {"tanh", [](const auto& x) { return tanh(x); }, [](const auto& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, reals},
    {"sigmoid", [](const auto& x) { return sigmoid(x); }, [](const auto& x) { return sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); }, reals},
    {"abs", [](const auto& x) { return abs(x); }, [](const auto& x) { return abs(x); }, [](double x) { return std::abs(x); }, reals},
    {"pow 3", [](const auto& x) { return pow(x, 3); }, [](const auto& x) { return pow(x, 3); }, [](double x) { return std::pow(x, 3.0); }, reals},
    {"pow -1.5", [](const auto& x) { return pow(x, -1.5); }, [](const auto& x) { return pow(x, -1.5); }, [](double x) { return std::pow(x, -1.5); }, positives},
    {"clamp", [](const auto& x) { return clamp(x, -0.5, 2.0); }, [](const auto& x) { return clamp(x, -0.5, 2.0); }, [](double x) { return std::clamp(x, -0.5, 2.0); }, reals},
};

}  // namespace

// The double tape calls the std:: functions themselves; sigmoid's stable branches are its only
// rearrangement. Each side is at most three correctly rounded steps (≤ 3u each, u = ε/2), so
// they differ by at most 3ε: bound 4ε. The 50-digit tape rounded to double must agree with the
// std:: function to its error (≤ 1 ulp in glibc) plus the final rounding (½ ulp): bound 2ε.
BOOST_AUTO_TEST_CASE(values_match_the_std_functions_in_both_precisions) {
    const double eps = std::numeric_limits<double>::epsilon();
    for (const Reference& r : references) {
        BOOST_TEST_CONTEXT(r.name) {
            Tape<double> in_double;
            Tape<mp50> in_mp;
            const double double_error = worst_relative(r.in_double(row_leaf(in_double, r.xs)).value(), r.xs, r.expected);
            const double mp_error = worst_relative(r.in_mp(row_leaf(in_mp, r.xs)).value(), r.xs, r.expected);
            BOOST_TEST(double_error <= (r.name == "sigmoid" ? 4 * eps : 0.0));
            BOOST_TEST(mp_error <= 2 * eps);
        }
    }
}

// σ(±1e4): in double exactly 0 and 1 with derivative exactly 0 (and σ(±inf) = 0, 1). In 50
// digits σ(−1e4) = e^(−1e4) / (1 + e^(−1e4)) is representable and right to rounding, while
// 1 − e^(−1e4) rounds to exactly 1; the derivative, e^(−|a|) / (1 + e^(−|a|))², is right on both
// sides (from σ(1 − σ) it was 0 at +1e4). Never NaN, never an overflow.
BOOST_AUTO_TEST_CASE(sigmoid_is_stable_for_large_inputs) {
    Tape<double> tape;
    const Var<double> x = row_leaf(tape, {-1e4, 1e4, -inf, inf});
    const Var<double> y = sigmoid(x);
    tape.backward(sum(y));
    BOOST_TEST(y.value() == Tensor<double>(Shape{1, 4}, std::vector<double>{0, 1, 0, 1}));
    BOOST_TEST(x.grad() == Tensor<double>(Shape{1, 4}, 0.0));

    Tape<mp50> tape_mp;
    const Var<mp50> x_mp = row_leaf(tape_mp, {-1e4, 1e4});
    const Var<mp50> y_mp = sigmoid(x_mp);
    tape_mp.backward(sum(y_mp));
    const mp50 tiny = exp(mp50(-1e4));
    BOOST_TEST(to_double(mp50(abs(y_mp.value()[0] / (tiny / (1 + tiny)) - 1))) <= 1e-45);
    BOOST_TEST(y_mp.value()[1] == mp50(1));
    for (const std::size_t k : {0u, 1u}) {  // σ'(±1e4) = e^(−1e4) / (1 + e^(−1e4))², both sides
        BOOST_TEST(to_double(mp50(abs(x_mp.grad()[k] * (1 + tiny) * (1 + tiny) / tiny - 1))) <= 1e-45);
    }
}

// tanh saturates to ±1 with derivative 0, exp underflows to 0 (e^(−inf) = 0, as after a mask)
// with derivative 0: results, not errors.
BOOST_AUTO_TEST_CASE(saturation_and_underflow_are_results_not_errors) {
    Tape<double> tape;
    const Var<double> x = row_leaf(tape, {-1e4, 1e4, -inf, inf});
    const Var<double> t = tanh(x);
    const Var<double> z = row_leaf(tape, {-1e4, -inf, 709});
    const Var<double> e = exp(z);
    tape.backward(add(sum(t), sum(e)));
    BOOST_TEST(t.value() == Tensor<double>(Shape{1, 4}, std::vector<double>{-1, 1, -1, 1}));
    BOOST_TEST(x.grad() == Tensor<double>(Shape{1, 4}, 0.0));
    BOOST_TEST(e.value()[0] == 0.0);
    BOOST_TEST(e.value()[1] == 0.0);
    BOOST_TEST(z.grad()[0] == 0.0);
    BOOST_TEST(z.grad()[1] == 0.0);
    BOOST_TEST(z.grad()[2] == std::exp(709.0));  // the largest whole exponent that does not overflow
}

// e^710 overflows in double but not in 50 digits (whose exponent range is far wider): the
// checker cannot compare such a graph and says which precision refused it, and why.
BOOST_AUTO_TEST_CASE(an_overflow_in_double_only_is_a_consistency_failure) {
    const CheckReport report = check_gradients([](auto in) { return sum(exp(in[0])); },
                                               {{"X", Tensor<double>::matrix({{1, 710}})}});
    BOOST_TEST(!report.passed);
    BOOST_TEST_REQUIRE(report.consistency_failures.size() == 1u);
    const std::string& failure = report.consistency_failures[0];
    BOOST_TEST(failure.find("double forward threw") != std::string::npos, failure);
    BOOST_TEST(failure.find("exp: value 710 at (0, 1)") != std::string::npos, failure);
}

// The documented values at kinks and at 0: abs' gives 0 at 0; clamp passes the gradient on its
// bounds (1) and stops it outside (0); sqrt and pow with p < 1 at 0 pass nothing when the upstream
// gradient is 0; 0^p and its derivative for p = 2, 1 and 0.
BOOST_AUTO_TEST_CASE(conventions_at_kinks_and_at_zero) {
    Tape<double> tape;
    const Var<double> x = row_leaf(tape, {0, -0.5, 0.75, -2, 2, 0.3});
    const Var<double> J = sum(add(abs(x), clamp(x, -0.5, 0.75)));
    tape.backward(J);
    // abs' = sign (0 at 0); clamp' = [lo ≤ x ≤ hi].
    BOOST_TEST(x.grad() == Tensor<double>(Shape{1, 6}, std::vector<double>{0 + 1, -1 + 1, 1 + 1, -1 + 0, 1 + 0, 1 + 1}));

    for (const double p : {2.0, 1.0, 0.0}) {
        BOOST_TEST_CONTEXT("p = " << p) {
            Tape<double> t;
            const Var<double> zero = row_leaf(t, {0});
            const Var<double> y = pow(zero, p);
            t.backward(sum(y));
            BOOST_TEST(y.value()[0] == (p == 0 ? 1.0 : 0.0));
            BOOST_TEST(zero.grad()[0] == (p == 1 ? 1.0 : 0.0));
        }
    }
    // At 0 the derivatives of √a and a^0.5 are infinite; with a zero upstream gradient (a masked
    // entry) nothing flows and no error is raised.
    Tape<double> t;
    const Var<double> zero = row_leaf(t, {0, 1});
    const Var<double> y = add(sqrt(zero), pow(zero, 0.5));
    t.backward(y, Tensor<double>(Shape{1, 2}, std::vector<double>{0, 1}));
    BOOST_TEST(y.value()[0] == 0.0);
    BOOST_TEST(zero.grad() == Tensor<double>(Shape{1, 2}, std::vector<double>{0, 1}));
}

namespace {

enum class Kind { shape, value };

struct Refusal {
    std::string what;
    Kind kind;
    std::function<void()> act;
    std::vector<std::string> words;  // each must appear in the message
};

// Runs `act` with a leaf of the given values, shaped [2 x 3] when there are six of them.
std::function<void()> with(std::vector<double> values, std::function<void(Tape<double>&, Var<double>)> act) {
    return [values, act] {
        Tape<double> tape;
        const Shape shape = values.size() == 6 ? Shape{2, 3} : Shape{1, values.size()};
        act(tape, tape.leaf(Tensor<double>(shape, values), "a"));
    };
}

const std::vector<double> sample = {0.5, 1, 2, 0.25, 1.5, 3};  // [2 x 3], in every op's domain

std::vector<double> with_at(std::size_t k, double value) {
    std::vector<double> values = sample;
    values[k] = value;
    return values;
}

const std::vector<Refusal> refusals = {
    {"log 0", Kind::value, with(with_at(1, 0), [](auto&, auto a) { log(a); }), {"log", "value 0", "(0, 1)", "[2x3]", "not positive"}},
    {"log -1", Kind::value, with(with_at(5, -1), [](auto&, auto a) { log(a); }), {"log", "value -1", "(1, 2)", "[2x3]", "not positive"}},
    {"log -inf", Kind::value, with(with_at(0, -inf), [](auto&, auto a) { log(a); }), {"log", "-inf", "(0, 0)", "not positive"}},
    {"log1p -1", Kind::value, with(with_at(4, -1), [](auto&, auto a) { log1p(a); }), {"log1p", "value -1", "(1, 1)", "[2x3]", "not above -1"}},
    {"log1p -2.5", Kind::value, with(with_at(0, -2.5), [](auto&, auto a) { log1p(a); }), {"log1p", "value -2.5", "(0, 0)", "not above -1"}},
    {"log1p -inf", Kind::value, with(with_at(5, -inf), [](auto&, auto a) { log1p(a); }), {"log1p", "-inf", "(1, 2)", "not above -1"}},
    {"sqrt -1", Kind::value, with(with_at(4, -1), [](auto&, auto a) { sqrt(a); }), {"sqrt", "value -1", "(1, 1)", "[2x3]", "negative"}},
    {"exp overflow", Kind::value, with(with_at(2, 710), [](auto&, auto a) { exp(a); }), {"exp", "710", "(0, 2)", "[2x3]", "overflows"}},
    {"exp +inf", Kind::value, with(with_at(3, inf), [](auto&, auto a) { exp(a); }), {"exp", "inf", "(1, 0)", "overflows"}},
    {"pow negative base, p = 0.5", Kind::value, with(with_at(1, -0.5), [](auto&, auto a) { pow(a, 0.5); }), {"pow", "value -0.5", "(0, 1)", "[2x3]", "non-integer exponent 0.5"}},
    {"pow negative base, p = 1/3", Kind::value, with(with_at(3, -8), [](auto&, auto a) { pow(a, 1.0 / 3); }), {"pow", "value -8", "(1, 0)", "non-integer exponent 0.333"}},
    {"pow zero base, p = -1", Kind::value, with(with_at(2, 0), [](auto&, auto a) { pow(a, -1); }), {"pow", "value 0", "(0, 2)", "negative exponent -1"}},
    {"pow overflow", Kind::value, with(with_at(0, 1e200), [](auto&, auto a) { pow(a, 2); }), {"pow", "1e+200", "(0, 0)", "overflows"}},
    {"pow infinite p", Kind::value, with(sample, [](auto&, auto a) { pow(a, inf); }), {"pow", "exponent inf", "not finite"}},
    {"pow NaN p", Kind::value, with(sample, [](auto&, auto a) { pow(a, nan); }), {"pow", "exponent nan", "not finite"}},
    {"clamp lo > hi", Kind::value, with(sample, [](auto&, auto a) { clamp(a, 1, -1); }), {"clamp", "lo = 1", "hi = -1", "lo ≤ hi"}},
    {"clamp NaN bound", Kind::value, with(sample, [](auto&, auto a) { clamp(a, nan, 1); }), {"clamp", "lo = nan", "lo ≤ hi"}},
    // Infinite derivatives at 0 with a non-zero upstream gradient: raised by the VJP, never ±inf.
    {"sqrt' at 0", Kind::value, with(with_at(4, 0), [](auto& t, auto a) { t.backward(sum(sqrt(a))); }), {"sqrt", "derivative", "infinite", "value 0", "(1, 1)", "[2x3]"}},
    {"pow' at 0, p = 0.5", Kind::value, with(with_at(0, 0), [](auto& t, auto a) { t.backward(sum(pow(a, 0.5))); }), {"pow", "derivative", "p = 0.5", "infinite", "value 0", "(0, 0)"}},
    // Empty inputs, every op.
    {"exp empty", Kind::shape, with({}, [](auto&, auto a) { exp(a); }), {"exp", "empty", "[1x0]"}},
    {"log empty", Kind::shape, with({}, [](auto&, auto a) { log(a); }), {"log", "empty", "[1x0]"}},
    {"sqrt empty", Kind::shape, with({}, [](auto&, auto a) { sqrt(a); }), {"sqrt", "empty", "[1x0]"}},
    {"tanh empty", Kind::shape, with({}, [](auto&, auto a) { tanh(a); }), {"tanh", "empty", "[1x0]"}},
    {"sigmoid empty", Kind::shape, with({}, [](auto&, auto a) { sigmoid(a); }), {"sigmoid", "empty", "[1x0]"}},
    {"abs empty", Kind::shape, with({}, [](auto&, auto a) { abs(a); }), {"abs", "empty", "[1x0]"}},
    {"pow empty", Kind::shape, with({}, [](auto&, auto a) { pow(a, 2); }), {"pow", "empty", "[1x0]"}},
    {"clamp empty", Kind::shape, with({}, [](auto&, auto a) { clamp(a, 0, 1); }), {"clamp", "empty", "[1x0]"}},
};

}  // namespace

BOOST_AUTO_TEST_CASE(refused_inputs_raise_named_errors) {
    for (const Refusal& r : refusals) {
        BOOST_TEST_CONTEXT(r.what) {
            bool caught = false;
            try {
                r.act();
            } catch (const tapegrad::error& e) {
                caught = true;
                const std::string message = e.what();
                BOOST_TEST_MESSAGE(r.what << ": " << message);
                const bool right_kind = r.kind == Kind::shape ? dynamic_cast<const shape_error*>(&e) != nullptr
                                                              : dynamic_cast<const value_error*>(&e) != nullptr;
                BOOST_TEST(right_kind, "wrong exception type " << typeid(e).name() << " for: " << message);
                for (const std::string& word : r.words) {
                    BOOST_TEST(message.find(word) != std::string::npos, "'" << word << "' missing from: " << message);
                }
            }
            BOOST_TEST(caught, "no tapegrad::error raised");
        }
    }
}

namespace {

// Fault controls: each VJP is wrong in a way a hand derivation could be, and the checker must
// reject it on the very leaves on which the correct op passes.

// σ' taken as σ itself: dA = G ∘ Y instead of G ∘ Y ∘ (1 − Y).
struct SigmoidWithYAsDerivative : Sigmoid {
    static constexpr std::string_view name = "sigmoid with Y as its derivative";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * at.out[k];
    }
};

// ln' taken as 1/a²: dA = G / A² instead of G / A.
struct LogWithInverseSquare : Log {
    static constexpr std::string_view name = "log with 1/a² as its derivative";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] / (A[k] * A[k]);
    }
};

// ln(1 + a)' taken as 1 − a (the first-order series, as if |a| stayed small): right at a = 0 only.
struct Log1pWithSeries : Log1p {
    static constexpr std::string_view name = "log1p with 1 - a as its derivative";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        const Tensor<T>& A = *at.in[0];
        for (std::size_t k = 0; k < at.G.size(); ++k) dA[k] = at.G[k] * T(1 - A[k]);
    }
};

// |a|' taken as 1 (the sign forgotten): right for positive values only.
struct AbsWithoutSign : Abs {
    static constexpr std::string_view name = "abs without the sign";
    template <Scalar T>
    static void vjp(const Settings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        std::copy(at.G.data().begin(), at.G.data().end(), dA.data().begin());
    }
};

// clamp passing the gradient everywhere, outside the bounds too.
struct ClampPassingEverything : Clamp {
    static constexpr std::string_view name = "clamp passing the gradient outside its bounds";
    template <Scalar T>
    static void vjp(const Settings<T>&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dA) {
        std::copy(at.G.data().begin(), at.G.data().end(), dA.data().begin());
    }
};

// The fault controls are driven through their recorded tapes, as every op of the tables: their
// siblings registered, as a user's op registers them (autodiff/rerun.hpp).
const bool faults_registered = register_siblings<SigmoidWithYAsDerivative>() && register_siblings<LogWithInverseSquare>() &&
                               register_siblings<Log1pWithSeries>() &&
                               register_siblings<AbsWithoutSign>() && register_siblings<ClampPassingEverything>();

struct FaultControl {
    std::string name;
    std::function<CheckReport(std::mt19937_64&)> correct, broken;
};

template <class Op, class V, class... Settings>
V record_unary(const V& A, Settings... settings) {
    return A.tape().template record<Op>({A}, settings...);
}

const Shape control_shape{3, 4};

const std::vector<FaultControl> controls = {
    {"sigmoid: G·Y",
     [](auto& rng) { return check_op_in([](auto in) { return sigmoid(in[0]); }, rng, {0, 6, true}, control_shape); },
     [](auto& rng) { return check_op_in([](auto in) { return record_unary<SigmoidWithYAsDerivative>(in[0]); }, rng, {0, 6, true}, control_shape); }},
    {"log: G/A²",
     [](auto& rng) { return check_op_in([](auto in) { return log(in[0]); }, rng, {0.5, 2}, control_shape); },
     [](auto& rng) { return check_op_in([](auto in) { return record_unary<LogWithInverseSquare>(in[0]); }, rng, {0.5, 2}, control_shape); }},
    {"log1p: G·(1 − A)",
     [](auto& rng) { return check_op_in([](auto in) { return log1p(in[0]); }, rng, {0, 0.5, true}, control_shape); },
     [](auto& rng) { return check_op_in([](auto in) { return record_unary<Log1pWithSeries>(in[0]); }, rng, {0, 0.5, true}, control_shape); }},
    {"abs: G",
     [](auto& rng) { return check_op_in([](auto in) { return abs(in[0]); }, rng, {0, 2, true, {0}}, control_shape); },
     [](auto& rng) { return check_op_in([](auto in) { return record_unary<AbsWithoutSign>(in[0]); }, rng, {0, 2, true, {0}}, control_shape); }},
    {"clamp: G everywhere",
     [](auto& rng) { return check_op_in([](auto in) { return clamp(in[0], -0.5, 0.75); }, rng, {0, 1.5, true, {-0.5, 0.75}}, control_shape); },
     [](auto& rng) {
         return check_op_in([](auto in) {
             using T = scalar_of<decltype(in[0])>;
             return record_unary<ClampPassingEverything>(in[0], Clamp::Settings<T>{T(-0.5), T(0.75)});
         }, rng, {0, 1.5, true, {-0.5, 0.75}}, control_shape);
     }},
};

}  // namespace

BOOST_AUTO_TEST_CASE(broken_vjps_are_rejected_where_the_correct_ones_pass) {
    for (const FaultControl& control : controls) {
        BOOST_TEST_CONTEXT(control.name) {
            std::mt19937_64 same_leaves_for_correct(99), same_leaves_for_broken(99);
            const CheckReport correct = control.correct(same_leaves_for_correct);
            const CheckReport broken = control.broken(same_leaves_for_broken);
            BOOST_TEST(correct.passed, correct.summary());
            BOOST_TEST(correct.max_error_mp <= 1e-25);
            BOOST_TEST(!broken.passed);
            // A wrong formula misses by the size of a derivative, not by rounding.
            BOOST_TEST(broken.max_error_mp > 1e-3);
            BOOST_TEST_MESSAGE(control.name << ": rejected, " << broken.failures << " of " << broken.coordinates
                                            << " derivatives wrong, max_error_mp " << broken.max_error_mp);
        }
    }
}

// Why log1p is an op: at |a| far below u, 1 + a rounds and log(1 + a) loses the digits log1p keeps.
// At a = 1e-10 in double, 1 + a is off by up to u = 1.1e-16 absolute, 1.1e-6 relative to a, so
// log(shift(a, 1)) is off by about 1e-7 relative (it is 8.3e-8 here, fixed by the rounding of
// 1 + 1e-10); log1p agrees with std::log1p bit for bit (the double tape calls it) and, on the
// 50-digit tape, with the series a − a²/2 + ... − a⁶/6 to 1e-48 relative (the first term left out,
// a⁷/7, is 1.4e-61 relative; the 50-digit unit roundoff is about 1e-50, and a few roundings of the
// series and of log1p stay below 1e-49). Its gradient 1/(1 + a) is right to the same bound.
BOOST_AUTO_TEST_CASE(log1p_keeps_the_digits_log_of_one_plus_a_loses) {
    const double a = 1e-10;
    Tape<double> tape;
    const Var<double> x = tape.leaf(Tensor<double>(Shape{1}, std::vector<double>{a}), "a");
    const double exact = log1p(x).value()[0], composed = log(shift(x, 1.0)).value()[0];
    BOOST_TEST(exact == std::log1p(a));
    BOOST_TEST(std::abs(composed - exact) / exact > 1e-8);  // the composition's loss is real
    Tape<mp50> wide;
    const mp50 w = mp50(1) / mp50(10000000000);  // 1e-10 to 50 digits
    const Var<mp50> X = wide.leaf(Tensor<mp50>(Shape{1}, std::vector<mp50>{w}), "a");
    const Var<mp50> Y = log1p(X);
    mp50 series = 0, power = 1;
    for (int k = 1; k <= 6; ++k) {
        power *= w;
        series += (k % 2 == 1 ? power : mp50(-power)) / k;
    }
    BOOST_TEST(to_double(abs(Y.value()[0] - series) / series) < 1e-48);
    wide.backward(Y);
    BOOST_TEST(to_double(abs(X.grad()[0] - mp50(1) / (1 + w))) < 1e-48);
}
