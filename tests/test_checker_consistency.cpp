// The checker's consistency checks (as in Stan's and PyTorch's gradcheck), proven to fire: test-only
// ops defined here break exactly one property each, and the report must name it; correct ops
// must pass with no consistency failure.
//   * a forward that throws in one precision only  -> "the double forward threw ..." (or 50-digit)
//   * a forward that throws in both                 -> the checker rethrows the error
//   * a VJP that changes between two backward runs  -> "backward run twice gave different gradients"
//   * a VJP that is not linear in G (non-zero at G = 0) -> "a zero upstream gradient gave a non-zero gradient"
#define BOOST_TEST_MODULE checker_consistency
#include "support.hpp"

#include <algorithm>
#include <type_traits>

using namespace tapegrad;

namespace {

// Identity whose forward throws for the scalar type `Throwing` (void: never).
template <class Throwing>
struct ThrowsIn {
    static constexpr std::string_view name = "throws_in";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        if constexpr (std::is_same_v<T, Throwing>) throw value_error("throws_in: refused in this precision");
        out = *in[0];
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& din) {
        const Tensor<T>& G = at.G;
        din = G;
    }
};

// Identity whose VJP drifts a little on every call after the first (per scalar type): the first
// backward is right, a second one differs, as a VJP reading stale or uninitialised state would.
struct DriftingVjp {
    static constexpr std::string_view name = "drifting_vjp";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        out = *in[0];
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& din) {
        const Tensor<T>& G = at.G;
        static int calls = 0;
        const T drift = T(calls++) * T(1e-3);
        for (std::size_t k = 0; k < G.size(); ++k) din[k] = G[k] * (T(1) + drift);
    }
};

// Identity whose VJP is G + (G − 1)²: right where G = 1 (directly under sum), not linear in G,
// and non-zero at G = 0.
struct AffineVjp {
    static constexpr std::string_view name = "affine_vjp";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        out = *in[0];
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& din) {
        const Tensor<T>& G = at.G;
        for (std::size_t k = 0; k < G.size(); ++k) din[k] = G[k] + (G[k] - T(1)) * (G[k] - T(1));
    }
};

template <class Op, Scalar T>
Var<T> apply(const Var<T>& x) {
    return x.tape().template record<Op>({x});
}

bool mentions(const CheckReport& report, const std::string& text) {
    return std::any_of(report.consistency_failures.begin(), report.consistency_failures.end(),
                       [&](const std::string& failure) { return failure.find(text) != std::string::npos; });
}

Tensor<double> input() {
    std::mt19937_64 rng(17);
    return testing::random_tensor(Shape{2, 3}, rng);
}

}  // namespace

BOOST_AUTO_TEST_CASE(correct_ops_pass_every_consistency_check) {
    const CheckReport report = check_gradients(
        [](auto in) { return sum(mul(softmax(in[0]), apply<ThrowsIn<void>>(in[0]))); }, {{"x", input()}});
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.consistency_failures.empty());
}

BOOST_AUTO_TEST_CASE(forward_throwing_in_one_precision_fails_the_check) {
    const CheckReport in_double =
        check_gradients([](auto in) { return sum(apply<ThrowsIn<double>>(in[0])); }, {{"x", input()}});
    BOOST_TEST(!in_double.passed);
    BOOST_TEST(mentions(in_double, "the double forward threw (throws_in: refused in this precision) but the 50-digit forward did not"),
               in_double.summary());
    const CheckReport in_mp =
        check_gradients([](auto in) { return sum(apply<ThrowsIn<mp50>>(in[0])); }, {{"x", input()}});
    BOOST_TEST(!in_mp.passed);
    BOOST_TEST(mentions(in_mp, "the 50-digit forward threw"), in_mp.summary());
}

BOOST_AUTO_TEST_CASE(forward_throwing_in_both_precisions_is_rethrown) {
    // A genuine input error (a mask value that is not 0 or 1) throws in both precisions.
    BOOST_CHECK_THROW(check_gradients(
                          [](auto in) {
                              using T = typename std::decay_t<decltype(in[0])>::scalar_type;
                              return sum(mask(in[0], in[0].tape().constant(Tensor<T>(Shape{2, 3}, T(2)))));
                          },
                          {{"x", input()}}),
                      value_error);
}

BOOST_AUTO_TEST_CASE(backward_twice_must_give_identical_gradients) {
    auto graph = [](auto in) { return sum(apply<DriftingVjp>(in[0])); };
    const CheckReport report = check_gradients(graph, {{"x", input()}});
    BOOST_TEST(!report.passed);
    BOOST_TEST(mentions(report, "backward run twice gave different gradients for x"), report.summary());
    // It is the consistency check that catches it: the first backward alone is right.
    CheckOptions without;
    without.check_consistency = false;
    const CheckReport unchecked = check_gradients(graph, {{"x", input()}}, without);
    BOOST_TEST(unchecked.consistency_failures.empty());
}

BOOST_AUTO_TEST_CASE(zero_upstream_gradient_must_give_zero_gradients) {
    auto graph = [](auto in) { return sum(apply<AffineVjp>(in[0])); };
    const CheckReport report = check_gradients(graph, {{"x", input()}});
    BOOST_TEST(!report.passed);
    BOOST_TEST(mentions(report, "a zero upstream gradient gave a non-zero gradient for x"), report.summary());
    BOOST_TEST(report.failures == 0u);  // every coordinate is right at G = 1: only linearity is broken
    CheckOptions without;
    without.check_consistency = false;
    BOOST_TEST(check_gradients(graph, {{"x", input()}}, without).passed);
}
