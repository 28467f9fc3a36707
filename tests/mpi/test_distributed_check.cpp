// The distributed gradient checker (check/distributed.hpp), run by CTest under
// `mpirun -np 2`: on every rank, the report of the distributed check must be the single-process
// report for the same seed, text for text (the seconds aside): passing graphs in full and fast
// mode, a broken VJP (its failures and worst coordinates), a fast check that falls back to full,
// and kinks. A graph that throws on one rank only must give a failed report on every rank, not a
// hang; a graph that throws on every rank rethrows, as one process would.
#define BOOST_TEST_MODULE distributed_check
#include "check/distributed.hpp"
#include "tests/support.hpp"

#include <boost/mpi/environment.hpp>

using namespace tapegrad;

namespace {

struct MpiEnvironment {
    boost::mpi::environment environment;
};

using testing::SoftmaxWithoutDenominator;  // wrong at every coordinate

// The summary with the time taken left out (it is the one figure that differs).
std::string text_of(CheckReport report) {
    report.seconds = 0;
    return report.summary();
}

// Causal multi-head attention with W_O (T = 6, D = 8, 2 heads), J = Σ Y∘Y; X feeds three products,
// so its branches are checked too.
const auto multihead_graph = [](auto in) {
    auto [X, W_Q, W_K, W_V, W_O] = in;
    MultiHeadOptions options;
    options.heads = 2;
    const auto Y =
        multihead_attention(X, MultiHeadWeights<typename decltype(X)::scalar_type>{W_Q, W_K, W_V, W_O}, options).Y;
    return sum(Y * Y);
};

struct MultiheadLeaves {
    NamedTensor leaves[5];
};

MultiheadLeaves multihead_leaves() {
    std::mt19937_64 rng(5);
    const auto weights = [&] { return testing::random_tensor({8, 8}, rng, 0.5); };
    MultiheadLeaves made{{{"X", testing::random_tensor({6, 8}, rng)}, {"W_Q", {}}, {"W_K", {}}, {"W_V", {}}, {"W_O", {}}}};
    for (std::size_t l = 1; l < 5; ++l) made.leaves[l].value = weights();
    return made;
}

// The identity, whose forward throws on rank `throwing_rank` once that rank's 50-digit tape has
// recorded it: on that rank, and only there, every replay that reaches it throws.
int throwing_rank = -1;
std::atomic<int> mp_forwards{0};

struct ThrowsWhenReplayed {
    static constexpr std::string_view name = "throws when replayed";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        if constexpr (std::is_same_v<T, mp50>) {
            if (mp_forwards++ > 0 && boost::mpi::communicator().rank() == throwing_rank) {
                throw value_error("replayed on the throwing rank");
            }
        }
        out = *in[0];
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& grad) {
        grad = at.G;
    }
};

// Both checks of `graph` on these leaves: on every rank, in one process and spread over all ranks.
// Returns the single-process report.
template <std::size_t N, class Graph>
CheckReport expect_same_report(Graph graph, const NamedTensor (&leaves)[N], const CheckOptions& options,
                        bool expect_pass) {
    const boost::mpi::communicator world;
    std::vector<RankLoad> loads;
    const CheckReport alone = check_gradients(graph, leaves, options);
    const CheckReport spread = check_gradients(graph, leaves, options, world, &loads);
    BOOST_TEST_MESSAGE("rank " << world.rank() << ": " << spread.summary());
    BOOST_TEST(alone.passed == expect_pass);
    BOOST_TEST(text_of(spread) == text_of(alone));
    BOOST_TEST(loads.size() == static_cast<std::size_t>(world.size()));
    for (const RankLoad& load : loads) BOOST_TEST(load.derivatives > 0u);  // every rank took a share
    return alone;
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(MpiEnvironment);

BOOST_AUTO_TEST_CASE(runs_on_several_ranks) {
    // The test is meant for mpirun -np 2 (CTest); one rank would compare a check with itself.
    BOOST_TEST(boost::mpi::communicator().size() >= 2);
}

BOOST_AUTO_TEST_CASE(full_check_of_multihead_attention_matches_one_process) {
    expect_same_report(multihead_graph, multihead_leaves().leaves, CheckOptions{}, true);
}

BOOST_AUTO_TEST_CASE(fast_check_of_multihead_attention_matches_one_process) {
    CheckOptions options;
    options.mode = CheckOptions::Mode::fast;
    options.directions = 5;
    expect_same_report(multihead_graph, multihead_leaves().leaves, options, true);
}

// A tape recorded by ordinary code (check/recorded.hpp), checked over the ranks: the report of one
// process checking the same tape, text for text.
BOOST_AUTO_TEST_CASE(a_recorded_tape_checked_over_the_ranks_matches_one_process) {
    const MultiheadLeaves values = multihead_leaves();
    Tape<double> tape;
    std::array<Var<double>, 5> leaves;
    for (std::size_t l = 0; l < 5; ++l) leaves[l] = tape.leaf(values.leaves[l].value, values.leaves[l].name);
    const Var<double> J = multihead_graph(leaves);
    const CheckReport alone = check_gradients(tape, J);
    const CheckReport ranks = check_gradients(tape, J, CheckOptions{}, boost::mpi::communicator());
    BOOST_TEST(alone.passed, alone.summary());
    BOOST_TEST(text_of(ranks) == text_of(alone));
}

// A wrong VJP: the full check fails at every coordinate of both leaves, and the worst coordinates
// listed must be the same ones; fast mode falls back to full and must do the same.
BOOST_AUTO_TEST_CASE(a_wrong_vjp_fails_with_the_same_worst_coordinates) {
    std::mt19937_64 rng(9);
    const NamedTensor leaves[] = {{"X", testing::random_tensor({5, 4}, rng)}, {"W", testing::random_tensor({4, 4}, rng)}};
    const auto graph = [](auto in) {
        auto [X, W] = in;
        const auto S = matmul(X, W);
        const auto A = S.tape().template record<SoftmaxWithoutDenominator>({S}, {});
        return sum(A * A) + sum(X * X);  // X has two consumers: its branches are checked too
    };
    CheckOptions options;
    options.max_reported = 8;
    const CheckReport full = expect_same_report(graph, leaves, options, false);
    BOOST_TEST(full.worst.size() == 8u);
    BOOST_TEST(!full.failed_branches().empty());
    options.mode = CheckOptions::Mode::fast;
    BOOST_TEST(expect_same_report(graph, leaves, options, false).mode == CheckMode::fast_then_full);
}

BOOST_AUTO_TEST_CASE(kinks_are_listed_the_same) {
    // abs at exact zeros: those coordinates are at kinks, the rest smooth.
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{0.0, 1.5, -2.0}, {0.0, 0.25, 0.0}})}};
    const CheckReport report =
        expect_same_report([](auto in) { return sum(abs(in[0])) + sum(in[0] * in[0]); }, leaves, CheckOptions{}, true);
    BOOST_TEST(report.kinks == 3u);
}

BOOST_AUTO_TEST_CASE(a_graph_that_throws_on_one_rank_fails_on_every_rank) {
    const boost::mpi::communicator world;
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{1, 2}, {3, 4}})}};
    const auto graph = [&](auto in) {
        if (world.rank() == 1) throw value_error("rank 1 cannot build this graph");
        return sum(in[0] * in[0]);
    };
    const CheckReport report = check_gradients(graph, leaves, CheckOptions{}, world);
    BOOST_TEST(!report.passed);
    BOOST_TEST_REQUIRE(report.consistency_failures.size() == 1u);
    BOOST_TEST(report.consistency_failures[0] ==
               fmt::format("rank 1 of {} threw: rank 1 cannot build this graph", world.size()));
}

BOOST_AUTO_TEST_CASE(a_replay_that_throws_on_one_rank_fails_on_every_rank) {
    // Rank 1 records the graph, then throws while taking its share of the differences: the other
    // ranks learn it at the exchange that follows, not by waiting for ever.
    const boost::mpi::communicator world;
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{1, 2}, {3, 4}})}};
    throwing_rank = 1;
    mp_forwards = 0;
    const auto graph = [](auto in) { return sum(in[0].tape().template record<ThrowsWhenReplayed>({in[0]}, {})); };
    const CheckReport report = check_gradients(graph, leaves, CheckOptions{}, world);
    throwing_rank = -1;
    BOOST_TEST(!report.passed);
    BOOST_TEST_REQUIRE(report.consistency_failures.size() == 1u);
    BOOST_TEST(report.consistency_failures[0] ==
               fmt::format("rank 1 of {} threw: replayed on the throwing rank", world.size()));
}

BOOST_AUTO_TEST_CASE(bad_inputs_on_every_rank_rethrow_as_in_one_process) {
    const boost::mpi::communicator world;
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{1, 2}})}};
    BOOST_CHECK_THROW(check_gradients([](auto in) { return in[0]; }, leaves, CheckOptions{}, world), usage_error);
}

BOOST_AUTO_TEST_CASE(shares_are_balanced_by_cost_and_interleaved) {
    // Two expensive items, four cheap ones: the cost, not the count, is split evenly, and equal
    // items alternate between the ranks in item order.
    const std::vector<double> costs{1, 1, 10, 1, 10, 1};
    const auto shares = detail::share_by_cost(costs, 2);
    BOOST_TEST(shares[0] == (std::vector<std::size_t>{0, 2, 3}));
    BOOST_TEST(shares[1] == (std::vector<std::size_t>{1, 4, 5}));
}
