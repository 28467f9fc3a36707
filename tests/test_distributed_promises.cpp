// The distributed checker's promises that hold without a second process (issue 49, item 2), run
// as an ordinary test, without mpirun: check/distributed.hpp's sharing of the finite differences
// among ranks (share_by_cost: by decreasing cost, a stable order among equal costs, each item to
// the least loaded rank and the lowest of equals, each share in item order), the report of a check
// that stopped (stopped_report: one line per rank that did not keep working, naming the first
// rank still at work) and the 6 numbers per item an exchange carries (pack, unpack). The exchanges
// themselves, and that only rank 0 reports progress, need several ranks: tests/mpi.
#define BOOST_TEST_MODULE distributed_promises
#include "check/distributed.hpp"
#include "support.hpp"

#include <numeric>
#include <string>
#include <vector>

using namespace tapegrad;

namespace {

// The shares by the definition in the header, computed here the slow way: items by decreasing cost,
// equal costs in item order; each to the rank whose load is least, the lowest such rank.
std::vector<std::vector<std::size_t>> reference_shares(const std::vector<double>& costs, std::size_t ranks) {
    std::vector<std::size_t> order;
    std::vector<bool> taken(costs.size(), false);
    for (std::size_t n = 0; n < costs.size(); ++n) {
        std::size_t best = costs.size();
        for (std::size_t i = 0; i < costs.size(); ++i)
            if (!taken[i] && (best == costs.size() || costs[i] > costs[best])) best = i;  // the first of the largest
        taken[best] = true;
        order.push_back(best);
    }
    std::vector<double> load(ranks, 0);
    std::vector<std::vector<std::size_t>> shares(ranks);
    for (const std::size_t item : order) {
        std::size_t rank = 0;
        for (std::size_t r = 1; r < ranks; ++r)
            if (load[r] < load[rank]) rank = r;
        shares[rank].push_back(item);
        load[rank] += costs[item];
    }
    for (auto& share : shares) std::sort(share.begin(), share.end());
    return shares;
}

}  // namespace

// Probes of one leaf cost the same, so equal costs go round the ranks in item order: 40 equal
// items on 3 ranks give rank r the items r, r + 3, r + 6, ... (a sort that is not stable scrambles
// equal items of a list this long, and a tie going to another rank than the lowest shifts them).
BOOST_AUTO_TEST_CASE(equal_costs_go_round_the_ranks_in_item_order) {
    const std::vector<double> costs(40, 2.5);
    const auto shares = detail::share_by_cost(costs, 3);
    BOOST_TEST_REQUIRE(shares.size() == 3u);
    for (std::size_t rank = 0; rank < 3; ++rank) {
        std::vector<std::size_t> expected;
        for (std::size_t item = rank; item < 40; item += 3) expected.push_back(item);
        BOOST_TEST(shares[rank] == expected, "rank " << rank);
    }
}

// Mixed costs (two leaves of 17 coordinates at costs 7 and 3, a branch of 9 at 5, zeros among
// them, in a shuffled order), on 1 to 5 ranks and more ranks than items: the shares are the
// definition's, every item in exactly one share, each share in item order.
BOOST_AUTO_TEST_CASE(shares_follow_the_definition_for_mixed_costs_and_any_number_of_ranks) {
    std::vector<double> costs;
    for (std::size_t k = 0; k < 17; ++k) costs.push_back(7);
    for (std::size_t k = 0; k < 9; ++k) costs.push_back(5);
    for (std::size_t k = 0; k < 17; ++k) costs.push_back(3);
    costs.insert(costs.end(), {0, 0, 0});
    std::mt19937_64 rng(3);
    std::shuffle(costs.begin(), costs.end(), rng);
    for (const std::size_t ranks : {1u, 2u, 3u, 4u, 5u, 60u}) {
        BOOST_TEST_CONTEXT(ranks << " ranks") {
            const auto shares = detail::share_by_cost(costs, ranks);
            BOOST_TEST((shares == reference_shares(costs, ranks)));
            std::vector<std::size_t> all;
            for (const auto& share : shares) {
                BOOST_TEST(std::is_sorted(share.begin(), share.end()));
                all.insert(all.end(), share.begin(), share.end());
            }
            std::sort(all.begin(), all.end());
            std::vector<std::size_t> every(costs.size());
            std::iota(every.begin(), every.end(), std::size_t{0});
            BOOST_TEST(all == every);
        }
    }
}

// The report of a stopped check, the same on every rank: failed, in consistency mode, with the
// seed, and one line per rank that was not working: each that threw, by its message, and each that
// had finished while another was still checking, naming the first rank still at work (its own
// failed verdict appended when it has one). A working rank gets no line.
BOOST_AUTO_TEST_CASE(a_stopped_check_reports_each_rank_that_did_not_keep_working) {
    using detail::Envelope;
    using detail::RankState;
    CheckOptions options;
    options.seed = 31;
    const std::vector<Envelope> envelopes{{RankState::finished, "", 0, {}, {}},
                                          {RankState::failed, "out of memory", 0, {}, {}},
                                          {RankState::working, "", 5, {}, {}},
                                          {RankState::finished, "gradcheck FAILED", 0, {}, {}},
                                          {RankState::working, "", 5, {}, {}}};
    const CheckReport report = detail::stopped_report(options, envelopes);
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.mode == CheckMode::consistency);
    BOOST_TEST(report.seed == 31u);
    BOOST_TEST(report.consistency_failures ==
               (std::vector<std::string>{
                   "rank 0 of 5 finished its check while rank 2 was still checking (the graph must be the same on "
                   "every rank)",
                   "rank 1 of 5 threw: out of memory",
                   "rank 3 of 5 finished its check while rank 2 was still checking (the graph must be the same on "
                   "every rank): gradcheck FAILED"}));
    // With no rank working, a finished rank is no fault of its own: only the ranks that threw.
    const CheckReport none_working = detail::stopped_report(
        options, {{RankState::finished, "", 0, {}, {}}, {RankState::failed, "bad input", 0, {}, {}}});
    BOOST_TEST(none_working.consistency_failures == (std::vector<std::string>{"rank 1 of 2 threw: bad input"}));
}

// An item's differences travel as 6 numbers: central, right, left at steps[0], then at steps[1];
// unpack reads back what pack wrote, after what was already there.
BOOST_AUTO_TEST_CASE(an_items_differences_travel_as_six_numbers_in_order) {
    const std::array<detail::Differences, 2> numeric{detail::Differences{mp50(1), mp50(2), mp50(3)},
                                                     detail::Differences{mp50(4), mp50(5), mp50(6)}};
    std::vector<mp50> packed{mp50(-1)};
    detail::pack(numeric, packed);
    BOOST_TEST_REQUIRE(packed.size() == 7u);
    for (std::size_t k = 0; k < 7; ++k) BOOST_TEST(packed[k] == mp50(double(k) == 0 ? -1 : double(k)));
    const auto back = detail::unpack(std::span<const mp50>(packed).subspan(1, 6));
    for (std::size_t s = 0; s < 2; ++s) {
        BOOST_TEST(back[s].central == numeric[s].central);
        BOOST_TEST(back[s].right == numeric[s].right);
        BOOST_TEST(back[s].left == numeric[s].left);
    }
}
