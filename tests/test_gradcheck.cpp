// The checker itself: what a failure report says (leaf, index, analytic and numeric values
// labelled, errors, count, seed), which inputs it refuses, and that fast mode checks a larger
// graph through directional derivatives.
#define BOOST_TEST_MODULE gradcheck
#include "support.hpp"

using namespace tapegrad;

namespace {

// exp-free op with a deliberately wrong VJP: Y = 3X but dX = 2G.
struct TripleWithWrongVjp {
    static constexpr std::string_view name = "triple (wrong VJP)";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        out.resize(in[0]->shape());
        for (std::size_t k = 0; k < out.size(); ++k) out[k] = 3 * (*in[0])[k];
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        const Tensor<T>& G = at.G;
        for (std::size_t k = 0; k < G.size(); ++k) grad[k] = 2 * G[k];
    }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_failure_report_names_leaf_index_values_errors_count_and_seed) {
    CheckOptions options;
    options.seed = 12345;
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [W] = in;
            return sum(W.tape().template record<TripleWithWrongVjp>({W}));
        },
        {{"W", Tensor<double>::matrix({{1, 2, 3}, {4, 5, 6}})}}, options);
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.failures == 6u);
    BOOST_TEST(report.coordinates == 6u);
    const std::string text = report.summary();
    BOOST_TEST_MESSAGE(text);
    for (const char* expected : {"FAILED", "6 of 6", "seed 12345", "leaf W index (0, 0)", "analytic (", "= 2",
                                 "numeric (50-digit central difference", "= 3", "abs error", "rel error", "threshold"}) {
        BOOST_TEST(text.find(expected) != std::string::npos, "report lacks '" << expected << "':\n" << text);
    }
    BOOST_TEST_REQUIRE(!report.worst.empty());
    BOOST_TEST(report.worst.front().analytic == 2.0);
    BOOST_TEST(report.worst.front().numeric == 3.0, boost::test_tools::tolerance(1e-30));
}

BOOST_AUTO_TEST_CASE(non_finite_or_empty_leaves_and_non_scalar_graphs_are_refused) {
    const auto graph = [](auto in) {
        auto [X] = in;
        return sum(X);
    };
    Tensor<double> infinite = Tensor<double>::matrix({{1, 2}});
    infinite[1] = std::numeric_limits<double>::infinity();
    BOOST_CHECK_EXCEPTION(check_gradients(graph, {{"X", infinite}}), value_error, [](const value_error& e) {
        return std::string(e.what()).find("leaf X") != std::string::npos;
    });
    BOOST_CHECK_THROW(check_gradients(graph, {{"X", Tensor<double>(Shape{0, 2})}}), shape_error);
    BOOST_CHECK_THROW(check_gradients([](auto in) { return in[0]; }, {{"X", Tensor<double>::matrix({{1, 2}})}}),
                      usage_error);
}

BOOST_AUTO_TEST_CASE(fast_mode_checks_a_larger_attention_graph) {
    // T = 32, D = 16, d = 8, r = 12: 896 coordinates; fast mode compares 3 random unit directions,
    // and 3 more for each of X's three branches.
    std::mt19937_64 rng(21);
    CheckOptions options;
    options.mode = CheckOptions::Mode::fast;
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [X, W_Q, W_K, W_V] = in;
            return testing::probe(attention(X, W_Q, W_K, W_V).O);
        },
        {{"X", testing::random_tensor({32, 16}, rng)},
         {"W_Q", testing::random_tensor({16, 8}, rng)},
         {"W_K", testing::random_tensor({16, 8}, rng)},
         {"W_V", testing::random_tensor({16, 12}, rng)}},
        options);
    BOOST_TEST_MESSAGE(report.summary());
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.mode == CheckMode::fast);
    BOOST_TEST(report.coordinates == 3u);
    BOOST_TEST(report.max_error_mp <= 1e-25);
    BOOST_TEST(report.branches.size() == 3u);
    BOOST_TEST(report.failed_branches().empty());
}

BOOST_AUTO_TEST_CASE(the_report_prints_modes_and_sources_in_the_same_words) {
    // Tools and logs read these words: the enums must print exactly what the report always said.
    CheckOptions options;
    options.mode = CheckOptions::Mode::fast;
    const CheckReport report = check_gradients(
        [](auto in) {
            auto [W] = in;
            return sum(W.tape().template record<TripleWithWrongVjp>({W}));
        },
        {{"W", Tensor<double>::matrix({{1, 2}})}}, options);
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.mode == CheckMode::fast_then_full);
    BOOST_TEST_REQUIRE(!report.worst.empty());
    BOOST_TEST(report.worst.front().source == Source::mp_tape);
    const std::string text = report.summary();
    for (const char* expected : {"(fast, then full mode, seed", "analytic (50-digit tape) = 2"}) {
        BOOST_TEST(text.find(expected) != std::string::npos, "report lacks '" << expected << "':\n" << text);
    }
    BOOST_TEST(to_string(CheckMode::full) == "full");
    BOOST_TEST(to_string(CheckMode::fast) == "fast");
    BOOST_TEST(to_string(CheckMode::fast_then_full) == "fast, then full");
    BOOST_TEST(to_string(CheckMode::consistency) == "consistency");
    BOOST_TEST(to_string(Source::mp_tape) == "50-digit tape");
    BOOST_TEST(to_string(Source::double_tape) == "double tape");
    BOOST_TEST(to_string(Source::step_agreement) == "step agreement");
    BOOST_TEST(to_string(Source::mp_tape_at_kink) == "50-digit tape at a kink");
}

// plan_check lists what a full check compares: each leaf's coordinates, then one group per branch of
// a leaf that feeds several ops (X feeds Q, K and V: three), the same count the full check reports,
// with positive replay costs and measured times; an upstream leaf (X) costs more to replay than a
// leaf read only by the last product (W_V's consumers are fewer).
BOOST_AUTO_TEST_CASE(the_plan_counts_what_the_full_check_compares) {
    std::mt19937_64 rng(22);
    const auto graph = [](auto in) {
        auto [X, W_Q, W_K, W_V] = in;
        return testing::probe(attention(X, W_Q, W_K, W_V).O);
    };
    const NamedTensor leaves[] = {{"X", testing::random_tensor({4, 3}, rng)},
                                  {"W_Q", testing::random_tensor({3, 2}, rng)},
                                  {"W_K", testing::random_tensor({3, 2}, rng)},
                                  {"W_V", testing::random_tensor({3, 2}, rng)}};
    const CheckPlan plan = plan_check(graph, leaves);
    BOOST_TEST_REQUIRE(plan.groups.size() == 7u);  // X, its 3 branches, W_Q, W_K, W_V
    BOOST_TEST(plan.groups[0].leaf == "X");
    BOOST_TEST(!plan.groups[0].branch);
    for (std::size_t b = 1; b <= 3; ++b) BOOST_TEST((plan.groups[b].leaf == "X" && plan.groups[b].branch));
    BOOST_TEST(plan.derivatives() == 12u + 3 * 12u + 3 * 6u);
    for (const CheckPlan::Group& g : plan.groups) {
        BOOST_TEST(g.cost > 0.0);
        BOOST_TEST(g.cpu_seconds_each > 0.0);
        BOOST_TEST(g.samples == 4u);
    }
    BOOST_TEST(plan.predicted_cpu_seconds() > 0.0);
    BOOST_TEST(plan.groups[0].cost / 12.0 > plan.groups[6].cost / 6.0);
    const CheckReport full = check_gradients(graph, leaves);
    BOOST_TEST(full.branches.size() == 3u);
    BOOST_TEST(full.coordinates + 3 * 12u == plan.derivatives());  // each branch: X's 12 coordinates
    BOOST_CHECK_THROW(plan_check(graph, leaves, {}, 1), value_error);
}
