// Kinks in the gradient checker: where J is not differentiable at the point checked (abs at 0,
// relu at 0, max at a tie), the coordinate is reported AT A KINK, neither a pass nor a failure,
// and the verdict does not fail on it; a wrong VJP is still a failure, at a smooth point and next
// to a kink; fast mode falls back to full at a kink; branches are classified the same way; and
// the report text without kinks is what it always was. The ops are test-local: they depend on
// nothing but the op contract.
#define BOOST_TEST_MODULE kinks
#include "support.hpp"

#include <string>

using namespace tapegrad;
using tapegrad::testing::scalar_of;

namespace {

// |x|, with the subgradient sign(0) = 0 at the kink.
struct TestAbs {
    static constexpr std::string_view name = "abs (test)";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& x = *in[0];
        out.resize(x.shape());
        for (std::size_t k = 0; k < x.size(); ++k) out[k] = x[k] < 0 ? T(-x[k]) : x[k];
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dx) {
        const Tensor<T>& x = *at.in[0];
        for (std::size_t k = 0; k < x.size(); ++k) dx[k] = x[k] > 0 ? at.G[k] : x[k] < 0 ? T(-at.G[k]) : T(0);
    }
};

// Fault control: abs whose VJP doubles the slope, dx = 2·sign(x)·G.
struct AbsWithDoubledVjp : TestAbs {
    static constexpr std::string_view name = "abs with a doubled VJP";
    template <Scalar T>
    static void vjp(const NoSettings& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& dx) {
        TestAbs::vjp(s, at, which, dx);
        for (std::size_t k = 0; k < dx.size(); ++k) dx[k] *= 2;
    }
};

// max(x, 0), with the subgradient 0 at the kink.
struct TestRelu {
    static constexpr std::string_view name = "relu (test)";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& x = *in[0];
        out.resize(x.shape());
        for (std::size_t k = 0; k < x.size(); ++k) out[k] = x[k] > 0 ? x[k] : T(0);
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dx) {
        const Tensor<T>& x = *at.in[0];
        for (std::size_t k = 0; k < x.size(); ++k) dx[k] = x[k] > 0 ? at.G[k] : T(0);
    }
};

// Fault control: relu whose VJP passes G through everywhere (the identity's).
struct ReluWithIdentityVjp : TestRelu {
    static constexpr std::string_view name = "relu with the identity's VJP";
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dx) {
        dx = at.G;
    }
};

// Elementwise max(a, b) of two same-shaped inputs; at a tie each input gets half of G.
struct TestMax {
    static constexpr std::string_view name = "max (test)";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& a = *in[0];
        const Tensor<T>& b = *in[1];
        out.resize(a.shape());
        for (std::size_t k = 0; k < a.size(); ++k) out[k] = a[k] < b[k] ? b[k] : a[k];
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t which, Tensor<T>& din) {
        const Tensor<T>& mine = *at.in[which];
        const Tensor<T>& other = *at.in[1 - which];
        for (std::size_t k = 0; k < mine.size(); ++k) {
            din[k] = mine[k] > other[k] ? at.G[k] : mine[k] == other[k] ? T(at.G[k] / 2) : T(0);
        }
    }
};

template <class Op, class V>
V unary(const V& X) {
    return X.tape().template record<Op>({X});
}

bool mentions(const std::string& text, const std::string& words) { return text.find(words) != std::string::npos; }

// Kinks are found from 50-digit one-sided differences, whose errors are ~h·|J''| + ε|J|/h ≪ 1e-12
// for these piecewise-linear graphs; the derivatives they report are read to that precision.
const auto one_sided_precision = boost::test_tools::tolerance(1e-12);

}  // namespace

BOOST_AUTO_TEST_CASE(abs_at_zero_is_reported_at_a_kink_and_the_other_coordinates_pass) {
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X] = in;
            return sum(unary<TestAbs>(X));
        },
        {{"X", Tensor<double>::matrix({{0.5, 0.0, -1.25}, {2.0, -0.75, 1.5}})}});
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 1u);
    BOOST_TEST(report.failures == 0u);
    BOOST_TEST(report.coordinates == 6u);
    BOOST_TEST(report.worst.empty());
    BOOST_TEST(report.max_error_mp <= 1e-25);
    BOOST_TEST(report.max_error_double <= 1e-9);
    BOOST_TEST_REQUIRE(report.first_kinks.size() == 1u);
    const Kink& kink = report.first_kinks.front();
    BOOST_TEST(kink.leaf == "X");
    BOOST_TEST(kink.index == "(0, 1)");
    BOOST_TEST(kink.branch.empty());
    BOOST_TEST(kink.left == -1.0, one_sided_precision);
    BOOST_TEST(kink.right == 1.0, one_sided_precision);
    BOOST_TEST(kink.analytic == 0.0);
    const std::string text = report.summary();
    for (const char* expected : {"gradcheck passed", "0 of 6 derivatives exceed", "; 1 coordinate at a kink; ",
                                 "\n  leaf X index (0, 1): at a kink: left derivative -1", ", right derivative 1",
                                 ", analytic 0 (neither pass nor failure)"}) {
        BOOST_TEST(mentions(text, expected), "report lacks '" << expected << "':\n" << text);
    }
}

BOOST_AUTO_TEST_CASE(a_kink_under_a_random_probe_is_a_kink_too) {
    std::mt19937_64 rng(31);
    Tensor<double> X = testing::random_tensor({3, 4}, rng);
    X[5] = 0.0;
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X] = in;
            return testing::probe(unary<TestAbs>(X));
        },
        {{"X", X}});
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 1u);
    BOOST_TEST(report.failures == 0u);
    BOOST_TEST_REQUIRE(report.first_kinks.size() == 1u);
    const Kink& kink = report.first_kinks.front();
    BOOST_TEST(kink.index == index_string(X.shape(), 5));
    BOOST_TEST(kink.right == -kink.left, one_sided_precision);  // ±G at that coordinate
    BOOST_TEST(std::abs(kink.right) > 1e-8);
}

BOOST_AUTO_TEST_CASE(relu_at_zero_is_reported_at_a_kink) {
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X] = in;
            return sum(unary<TestRelu>(X));
        },
        {{"X", Tensor<double>::matrix({{0.0, 0.5}, {-2.0, 3.0}})}});
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 1u);
    BOOST_TEST(report.failures == 0u);
    BOOST_TEST_REQUIRE(report.first_kinks.size() == 1u);
    const Kink& kink = report.first_kinks.front();
    BOOST_TEST(kink.index == "(0, 0)");
    BOOST_TEST(kink.left == 0.0, one_sided_precision);
    BOOST_TEST(kink.right == 1.0, one_sided_precision);
    BOOST_TEST(kink.analytic == 0.0);
}

BOOST_AUTO_TEST_CASE(max_at_a_tie_is_a_kink_in_both_inputs) {
    // At the tie, the tape gives each input half of G: the average of the one-sided derivatives,
    // so the central difference would agree. It is a kink all the same, not a pass.
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [A, B] = in;
            return sum(A.tape().template record<TestMax>({A, B}));
        },
        {{"A", Tensor<double>::matrix({{1.0, 2.0, -1.0}})}, {"B", Tensor<double>::matrix({{3.0, 2.0, -4.0}})}});
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 2u);
    BOOST_TEST(report.failures == 0u);
    BOOST_TEST(report.coordinates == 6u);
    BOOST_TEST_REQUIRE(report.first_kinks.size() == 2u);
    for (std::size_t k = 0; k < 2; ++k) {
        const Kink& kink = report.first_kinks[k];
        BOOST_TEST(kink.leaf == (k == 0 ? "A" : "B"));
        BOOST_TEST(kink.index == "(0, 1)");
        BOOST_TEST(kink.left == 0.0, one_sided_precision);
        BOOST_TEST(kink.right == 1.0, one_sided_precision);
        BOOST_TEST(kink.analytic == 0.5);
    }
    BOOST_TEST(mentions(report.summary(), "; 2 coordinates at kinks; "), report.summary());
}

BOOST_AUTO_TEST_CASE(a_wrong_vjp_at_a_smooth_point_still_fails) {
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X] = in;
            return sum(unary<AbsWithDoubledVjp>(X));
        },
        {{"X", Tensor<double>::matrix({{0.5, -1.0}, {2.0, -0.25}})}});
    BOOST_TEST(!report.passed, "a doubled abs VJP was accepted: " << report.summary());
    BOOST_TEST(report.failures == 4u);
    BOOST_TEST(report.kinks == 0u);
    BOOST_TEST(report.first_kinks.empty());
    BOOST_TEST(!mentions(report.summary(), "kink"), report.summary());
}

BOOST_AUTO_TEST_CASE(a_wrong_vjp_next_to_a_kink_still_fails) {
    // X has a kink at (0, 1) and a correct VJP; W's relu has the identity's VJP, wrong where W < 0.
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X, W] = in;
            return add(sum(unary<TestAbs>(X)), sum(unary<ReluWithIdentityVjp>(W)));
        },
        {{"X", Tensor<double>::matrix({{1.5, 0.0}})}, {"W", Tensor<double>::matrix({{-0.5, 2.0, -3.0}})}});
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(!report.passed, "relu with the identity's VJP was accepted: " << report.summary());
    BOOST_TEST(report.failures == 2u);
    BOOST_TEST(report.kinks == 1u);
    BOOST_TEST(report.max_error_mp >= 1.0);  // the failures count in the max errors
    for (const Mismatch& m : report.worst) BOOST_TEST(m.leaf == "W");
    BOOST_TEST_REQUIRE(report.first_kinks.size() == 1u);
    BOOST_TEST(report.first_kinks.front().leaf == "X");
    BOOST_TEST(report.first_kinks.front().index == "(0, 1)");
}

BOOST_AUTO_TEST_CASE(fast_mode_at_a_kink_falls_back_to_full_and_reports_it) {
    std::mt19937_64 rng(47);
    Tensor<double> X = testing::random_tensor({3, 4}, rng);
    X[7] = 0.0;
    CheckOptions options;
    options.mode = CheckOptions::Mode::fast;
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X] = in;
            return testing::probe(unary<TestAbs>(X));
        },
        {{"X", X}}, options);
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.mode == CheckMode::fast_then_full);
    BOOST_TEST(report.coordinates == 12u);
    BOOST_TEST(report.kinks == 1u);
    BOOST_TEST(report.failures == 0u);
    BOOST_TEST_REQUIRE(report.first_kinks.size() == 1u);
    BOOST_TEST(report.first_kinks.front().index == index_string(X.shape(), 7));  // a coordinate, not a direction
}

BOOST_AUTO_TEST_CASE(a_branch_at_a_kink_is_classified_the_same_way) {
    // X feeds abs and add: the abs branch has the kink at (0, 0), the add branch none.
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X] = in;
            return sum(add(unary<TestAbs>(X), X));
        },
        {{"X", Tensor<double>::matrix({{0.0, -2.0, 0.75}})}});
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 1u);
    BOOST_TEST_REQUIRE(report.branches.size() == 2u);
    std::size_t branch_kinks = 0;
    for (const BranchReport& b : report.branches) {
        BOOST_TEST(b.failures == 0u);
        BOOST_TEST(b.kinks == (mentions(b.consumer, "abs") ? 1u : 0u), b.consumer);
        branch_kinks += b.kinks;
    }
    BOOST_TEST(branch_kinks == 1u);
    BOOST_TEST_REQUIRE(report.first_kinks.size() == 2u);  // the whole gradient first, then the branch
    BOOST_TEST(report.first_kinks[0].branch.empty());
    BOOST_TEST(report.first_kinks[0].left == 0.0, one_sided_precision);  // −1 from abs, +1 from add
    BOOST_TEST(report.first_kinks[0].right == 2.0, one_sided_precision);
    BOOST_TEST(mentions(report.first_kinks[1].branch, "abs"));
    BOOST_TEST(report.first_kinks[1].left == -1.0, one_sided_precision);
    BOOST_TEST(report.first_kinks[1].right == 1.0, one_sided_precision);
    BOOST_TEST(mentions(report.summary(), "(1 coordinate at a kink)"), report.summary());
}

BOOST_AUTO_TEST_CASE(a_steep_smooth_point_is_not_a_kink) {
    // J = 1e6·Σx² at x = 0: J' = 0, J'' = 2e6. The one-sided differences part by h·J'' = 2e-8 at
    // h = 1e-14, above the kink threshold, but by 2e-10 at h = 1e-16: a kink must part at both.
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X] = in;
            using T = scalar_of<decltype(X)>;
            return scale(sum(mul(X, X)), T(1e6));
        },
        {{"X", Tensor<double>::matrix({{0.0, 1e-3}})}});
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 0u);
    BOOST_TEST(report.max_error_mp <= 1e-25);
}

BOOST_AUTO_TEST_CASE(a_smooth_attention_graph_has_no_kinks) {
    std::mt19937_64 rng(5);
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X, W_Q, W_K, W_V] = in;
            return testing::probe(attention(X, W_Q, W_K, W_V).O);
        },
        {{"X", testing::random_tensor({3, 4}, rng)},
         {"W_Q", testing::random_tensor({4, 2}, rng)},
         {"W_K", testing::random_tensor({4, 2}, rng)},
         {"W_V", testing::random_tensor({4, 3}, rng)}});
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 0u);
    BOOST_TEST(report.first_kinks.empty());
    for (const BranchReport& b : report.branches) BOOST_TEST(b.kinks == 0u);
    BOOST_TEST(!mentions(report.summary(), "kink"), report.summary());
}

BOOST_AUTO_TEST_CASE(the_summary_without_kinks_is_unchanged) {
    // The literal is what summary() printed before kinks were classified, for the same report.
    CheckReport report;
    report.passed = false;
    report.mode = CheckMode::fast_then_full;
    report.seed = 77;
    report.coordinates = 6;
    report.failures = 1;
    report.max_error_double = 2.5e-3;
    report.max_error_mp = 0.5;
    report.max_step_disagreement = 1.25e-30;
    report.worst.push_back(Mismatch{"W", "(0, 1)", "", Source::mp_tape, 2.0, 3.0, 1e-14, 1.0, 0.5, 1e-25});
    report.worst.push_back(Mismatch{"X", "(1, 0)", "matmul -> K (input 0)", Source::double_tape, 0.25, 0.125, 1e-16,
                                    0.125, 0.125, 1e-9});
    report.branches.push_back(BranchReport{"X", "matmul -> K (input 0)", 0.125, 1});
    report.branches.push_back(BranchReport{"X", "matmul -> Q (input 0)", 1e-40, 0});
    report.consistency_failures.push_back("backward run twice gave different gradients for W");
    report.seconds = 0.25;
    const std::string before =
        "gradcheck FAILED (fast, then full mode, seed 77): 1 of 6 derivatives exceed the thresholds; max error double "
        "tape vs 50-digit differences 0.0025, 50-digit tape vs 50-digit differences 0.5, step agreement 1.25e-30; "
        "0.250 s\n"
        "  leaf W index (0, 1): analytic (50-digit tape) = 2, numeric (50-digit central difference, h=1e-14) = 3, "
        "abs error 1, rel error 0.5 > threshold 1e-25\n"
        "  leaf X index (1, 0) branch matmul -> K (input 0): analytic (double tape) = 0.25, numeric (50-digit "
        "central difference, h=1e-16) = 0.125, abs error 0.125, rel error 0.125 > threshold 1e-09\n"
        "  branch X via matmul -> K (input 0): max error 0.125 (1 coordinates wrong)\n"
        "  branch X via matmul -> Q (input 0): max error 1e-40\n"
        "  consistency: backward run twice gave different gradients for W";
    BOOST_TEST(report.summary() == before);

    CheckReport clean;
    clean.seed = 5;
    clean.coordinates = 3;
    clean.seconds = 1.5;
    BOOST_TEST(clean.summary() ==
               "gradcheck passed (full mode, seed 5): 0 of 3 derivatives exceed the thresholds; max error double tape "
               "vs 50-digit differences 0, 50-digit tape vs 50-digit differences 0, step agreement 0; 1.500 s");
}

BOOST_AUTO_TEST_CASE(the_summary_with_kinks_counts_and_lists_them) {
    CheckReport report;
    report.seed = 5;
    report.coordinates = 4;
    report.kinks = 2;
    report.seconds = 1.5;
    report.first_kinks.push_back(Kink{"X", "(0, 1)", "", -1.0, 1.0, 0.0});
    report.first_kinks.push_back(Kink{"X", "(0, 1)", "abs -> node 1 (input 0)", 0.0, 1.0, 0.5});
    report.branches.push_back(BranchReport{"X", "abs -> node 1 (input 0)", 0.0, 0, 1});
    BOOST_TEST(report.summary() ==
               "gradcheck passed (full mode, seed 5): 0 of 4 derivatives exceed the thresholds; max error double tape "
               "vs 50-digit differences 0, 50-digit tape vs 50-digit differences 0, step agreement 0; 2 coordinates "
               "at kinks; 1.500 s\n"
               "  leaf X index (0, 1): at a kink: left derivative -1, right derivative 1, analytic 0 (neither pass "
               "nor failure)\n"
               "  leaf X index (0, 1) branch abs -> node 1 (input 0): at a kink: left derivative 0, right derivative "
               "1, analytic 0.5 (neither pass nor failure)\n"
               "  branch X via abs -> node 1 (input 0): max error 0 (1 coordinate at a kink)");
}

namespace {

// Fault control at the kink itself: abs whose VJP at exactly 0 says 3·G, outside the one-sided
// derivatives −1 and 1 (no convention allows it); right everywhere else.
struct AbsWithWrongSubgradient : TestAbs {
    static constexpr std::string_view name = "abs with 3 at the kink";
    template <Scalar T>
    static void vjp(const NoSettings& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& dx) {
        TestAbs::vjp(s, at, which, dx);
        const Tensor<T>& x = *at.in[0];
        for (std::size_t k = 0; k < x.size(); ++k)
            if (x[k] == T(0)) dx[k] = T(3) * at.G[k];
    }
};

}  // namespace

// At a kink any value between the one-sided derivatives is accepted as a convention (sign(0) = 0
// above); a value outside them is a failure, not a kink.
BOOST_AUTO_TEST_CASE(an_analytic_value_outside_the_one_sided_derivatives_at_a_kink_fails) {
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X] = in;
            return sum(unary<AbsWithWrongSubgradient>(X));
        },
        {{"X", Tensor<double>::matrix({{0.5, 0.0, -1.25}})}});
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.kinks == 0u);
    BOOST_TEST(report.failures == 1u);
    BOOST_TEST_REQUIRE(!report.worst.empty());
    BOOST_TEST(report.worst.front().index == "(0, 1)");
    BOOST_TEST(report.worst.front().numeric == 1.0, one_sided_precision);  // the nearer side
    BOOST_TEST(report.worst.front().source == Source::mp_tape_at_kink);
    BOOST_TEST(mentions(report.summary(), "analytic (50-digit tape at a kink) = 3, numeric (50-digit nearer one-sided difference"),
               report.summary());
}
