// Numerical behaviour the chapter asks about: extreme scores (softmax stays finite, saturated
// rows pass (near) zero gradient, no NaN), and the scaling argument as a seeded Monte-Carlo
// test: for independent unit-variance q and k, q·k/√d has variance ≈ 1; with q = k the mean is
// no longer zero.
#define BOOST_TEST_MODULE numerics
#include "support.hpp"

#include <boost/mpl/list.hpp>

using namespace tapegrad;

using scalar_types = boost::mpl::list<double, mp50>;

BOOST_AUTO_TEST_CASE_TEMPLATE(extreme_scores_stay_finite_and_saturated_rows_pass_no_gradient, T, scalar_types) {
    // Rows: ±1e4, 1e5 against 0, ±1e300, and a row with two tied maxima far above the third.
    Tape<T> tape;
    const Var<T> S = tape.leaf(Tensor<T>(Shape{4, 3}, std::vector<T>{T(1e4), T(-1e4), T(0),   //
                                                                     T(1e5), T(0), T(-1e5),   //
                                                                     T(1e300), T(-1e300), T(0),  //
                                                                     T(5e4), T(5e4), T(-5e4)}));
    const Var<T> A = softmax(S);
    std::mt19937_64 rng(1);
    const Tensor<T> G = tensor_cast<T>(testing::random_tensor({4, 3}, rng));
    tape.backward(A, G);
    for (const T& a : A.value().data()) BOOST_TEST(is_finite(a));
    for (const T& g : S.grad().data()) BOOST_TEST(is_finite(g));
    // The first three rows put all weight on one position: exp(−1e4) underflows to 0 in double
    // (and is ~1e-4343 in 50 digits), so the weights are one-hot up to that and dS is ~0.
    for (std::size_t i = 0; i < 3; ++i) {
        BOOST_TEST(to_double(A.value()(i, 0)) == 1.0);
        for (std::size_t j = 0; j < 3; ++j) BOOST_TEST(std::abs(to_double(S.grad()(i, j))) <= 1e-300);
    }
    // The tied row splits evenly between its two maxima and its gradient is not zero there.
    BOOST_TEST(to_double(A.value()(3, 0)) == 0.5);
    BOOST_TEST(to_double(A.value()(3, 1)) == 0.5);
    BOOST_TEST(to_double(S.grad()(3, 0)) == -to_double(S.grad()(3, 1)), boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(attention_with_huge_projections_is_finite) {
    // Scores of order 1e6 from large weights: no overflow, no NaN, the tape's NaN guard is quiet.
    Tape<double> tape;
    std::mt19937_64 rng(2);
    const auto leaf = [&](Shape s, double spread) { return tape.leaf(testing::random_tensor(s, rng, spread)); };
    const AttentionResult<double> r = attention(leaf({4, 3}, 1.0), leaf({3, 2}, 1e3), leaf({3, 2}, 1e3), leaf({3, 2}, 1.0));
    tape.backward(testing::probe(r.O));
    for (const double x : r.O.value().data()) BOOST_TEST(std::isfinite(x));
    for (const double x : r.S.grad().data()) BOOST_TEST(std::isfinite(x));
}

BOOST_AUTO_TEST_CASE(scaled_dot_products_of_independent_unit_vectors_have_unit_variance) {
    // z = q·k/√d with q, k independent, each coordinate N(0, 1). Then E z = 0 and Var z = 1
    // exactly, and Var(z²) = E z⁴ − 1 = 2 + 6/d (Gaussian fourth moments). With N samples the
    // sample variance has standard error sqrt((2 + 6/d)/N) and the sample mean 1/sqrt(N); we
    // allow 5 standard errors (a false alarm has probability < 1e-6 for a fresh seed).
    constexpr std::size_t d = 64, N = 20000;
    std::mt19937_64 rng(2026);
    std::normal_distribution<double> normal;
    double total = 0, total_sq = 0;
    for (std::size_t n = 0; n < N; ++n) {
        double dot = 0;
        for (std::size_t a = 0; a < d; ++a) dot += normal(rng) * normal(rng);
        const double z = dot / std::sqrt(double(d));
        total += z;
        total_sq += z * z;
    }
    const double mean = total / N;
    const double variance = total_sq / N - mean * mean;
    BOOST_TEST_MESSAGE("independent q, k: mean " << mean << ", variance " << variance);
    BOOST_TEST(std::abs(mean) <= 5 / std::sqrt(double(N)));
    BOOST_TEST(std::abs(variance - 1) <= 5 * std::sqrt((2 + 6.0 / d) / N));
    // Without the 1/√d the variance is d: the scale is what brings it back to one.
    BOOST_TEST(variance * d > 0.9 * d);
}

BOOST_AUTO_TEST_CASE(when_queries_equal_keys_the_mean_is_no_longer_zero) {
    // z = q·q/√d = |q|²/√d has mean d/√d = √d and variance 2d/d = 2: the independence
    // assumption behind "variance one" does not hold, and the scores are biased upwards.
    constexpr std::size_t d = 64, N = 20000;
    std::mt19937_64 rng(2027);
    std::normal_distribution<double> normal;
    double total = 0;
    for (std::size_t n = 0; n < N; ++n) {
        double dot = 0;
        for (std::size_t a = 0; a < d; ++a) {
            const double q = normal(rng);
            dot += q * q;
        }
        total += dot / std::sqrt(double(d));
    }
    const double mean = total / N;
    BOOST_TEST_MESSAGE("q = k: mean " << mean << " (sqrt(d) = " << std::sqrt(double(d)) << ")");
    BOOST_TEST(std::abs(mean - std::sqrt(double(d))) <= 5 * std::sqrt(2.0 / N));
    BOOST_TEST(mean > 100 * 5 / std::sqrt(double(N)));  // far outside the independent case's band
}
