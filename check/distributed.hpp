/// \file
/// The gradient checker spread over MPI processes (ranks) with Boost.MPI: the same check as
/// check_gradients in check/gradcheck.hpp, run as
///
///     boost::mpi::environment environment(argc, argv);   // once, in main
///     boost::mpi::communicator world;
///     CheckReport report = check_gradients(graph, leaves, options, world);
///
/// under `mpirun -np N`. Every rank records the graph and computes the analytic gradients (cheap);
/// the finite differences (the 50-digit replays, nearly all of the time) are shared among the
/// ranks, each taking its share with its own threads. The differences are then exchanged (one
/// all-gather per stage and per branch: 6 numbers of 50 digits per derivative) and every rank compares all of
/// them in the single-process order, so every rank ends with the report a single process gives
/// for the same seed: the same numbers, worst coordinates and verdict, by construction.
///
/// Shares are balanced by replay cost (detail::replay_cost: the work of every node downstream of
/// the moved leaf), not by count: a coordinate of W_O replays one product, one of X the whole
/// layer. When a rank throws (its graph, a replay), the ranks that are waiting for it learn so at
/// the next exchange, and every rank returns a failed report naming the rank and the error; no
/// rank is left waiting. When every rank throws before any exchange (bad inputs, as a single
/// process would rethrow), every rank rethrows its own error.
///
/// This is the only tapegrad header that includes MPI; check/gradcheck.hpp stays MPI-free. Build
/// with the tapegrad::mpi target (CMake option TAPEGRAD_WITH_MPI).
#pragma once

#include "check/gradcheck.hpp"
#include "check/recorded.hpp"

#include <boost/mpi/collectives/all_gather.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <numeric>
#include <string>
#include <vector>

#include <time.h>

namespace tapegrad {

/// What one rank did in a distributed check: the seconds (wall clock) it spent taking its share of
/// the finite differences, the CPU seconds of its process meanwhile (on a machine shared with
/// other work the wall clock also counts the time the rank waited for a core), how many
/// differences it took, and their estimated replay cost (what the shares balance).
struct RankLoad {
    double seconds = 0;
    double cpu_seconds = 0;
    std::size_t derivatives = 0;
    double cost = 0;

    template <class Archive>
    void serialize(Archive& archive, unsigned /*version*/) {
        archive & seconds & cpu_seconds & derivatives & cost;
    }
};

namespace detail {

/// Where a rank is when it meets the others at an exchange.
enum class RankState : int { working, finished, failed };

/// What a rank tells the others at each exchange.
struct Envelope {
    RankState state = RankState::working;
    std::string message;       ///< failed: what it threw; finished with a failed check: why
    std::size_t items = 0;     ///< working: the probes of this stage (all ranks must agree)
    std::vector<mp50> numeric;  ///< working: its share's differences, 6 numbers each, in item order
    RankLoad load;             ///< finished: its totals

    template <class Archive>
    void serialize(Archive& archive, unsigned /*version*/) {
        archive & state & message & items & numeric & load;
    }
};

/// Thrown on every rank when an exchange shows a rank that is no longer working: every rank stops
/// and makes its report from the same envelopes. Not a std::exception: nothing in the checker
/// mistakes it for an error of the graph.
struct RanksStopped {
    std::vector<Envelope> envelopes;
};

/// Each rank's items: given out by decreasing cost (a stable sort, so in item order among equal
/// costs), each to the rank with the least cost so far (the lowest such rank). Probes of one leaf
/// cost the same, so each rank gets every N-th coordinate of each leaf: the shares stay balanced
/// even where the estimate is off by a constant factor for some op. Each share is in item order.
inline std::vector<std::vector<std::size_t>> share_by_cost(std::span<const double> costs, std::size_t ranks) {
    std::vector<std::size_t> order(costs.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return costs[a] > costs[b]; });
    std::vector<double> load(ranks, 0.0);
    std::vector<std::vector<std::size_t>> shares(ranks);
    for (const std::size_t item : order) {
        const std::size_t rank = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        shares[rank].push_back(item);
        load[rank] += costs[item];
    }
    for (std::vector<std::size_t>& share : shares) std::sort(share.begin(), share.end());
    return shares;
}

/// CPU time of this process, all its threads.
inline double process_cpu_seconds() {
    timespec now{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

/// The differences the check compares, 6 numbers per item: central, right, left at both steps.
inline void pack(const std::array<Differences, 2>& numeric, std::vector<mp50>& into) {
    for (const Differences& d : numeric) into.insert(into.end(), {d.central, d.right, d.left});
}

inline std::array<Differences, 2> unpack(std::span<const mp50> from) {
    return {Differences{from[0], from[1], from[2]}, Differences{from[3], from[4], from[5]}};
}

/// The message of whatever was thrown.
inline std::string what_was_thrown(const std::exception_ptr& thrown) {
    try {
        std::rethrow_exception(thrown);
    } catch (const std::exception& e) {
        return e.what();
    } catch (...) {
        return "an exception that is not a std::exception";
    }
}

/// The finite differences shared among the ranks of a communicator (detail::WorkSplit).
class MpiSplit final : public WorkSplit {
public:
    explicit MpiSplit(const boost::mpi::communicator& world) : world_(world) {}

    void share(std::span<const double> costs, const std::function<void(std::span<const std::size_t>)>& take,
               std::vector<std::array<Differences, 2>>& numeric) override {
        const auto shares = share_by_cost(costs, static_cast<std::size_t>(world_.size()));
        const std::vector<std::size_t>& mine = shares[static_cast<std::size_t>(world_.rank())];
        Envelope envelope{RankState::working, {}, costs.size(), {}, {}};
        try {
            const auto start = std::chrono::steady_clock::now();
            const double cpu_start = process_cpu_seconds();
            take(mine);
            load_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            load_.cpu_seconds += process_cpu_seconds() - cpu_start;
            load_.derivatives += mine.size();
            for (const std::size_t item : mine) load_.cost += costs[item];
            for (const std::size_t item : mine) pack(numeric[item], envelope.numeric);
        } catch (...) {
            envelope = Envelope{RankState::failed, what_was_thrown(std::current_exception()), 0, {}, {}};
        }
        const std::vector<Envelope> all = exchange(envelope);
        for (std::size_t rank = 0; rank < all.size(); ++rank) {
            if (all[rank].items != costs.size() || all[rank].numeric.size() != 6 * shares[rank].size()) {
                throw usage_error(fmt::format("distributed gradcheck: rank {} has {} finite differences to take "
                                              "where rank {} has {}: the graph must be the same on every rank",
                                              rank, all[rank].items, world_.rank(), costs.size()));
            }
            const std::span<const mp50> theirs(all[rank].numeric);
            for (std::size_t k = 0; k < shares[rank].size(); ++k) numeric[shares[rank][k]] = unpack(theirs.subspan(6 * k, 6));
        }
    }

    /// Every rank's envelope; throws RanksStopped when any rank (this one too) is not working.
    std::vector<Envelope> exchange(const Envelope& mine) {
        std::vector<Envelope> all = gather(mine);
        const bool all_working = std::all_of(all.begin(), all.end(),
                                             [](const Envelope& e) { return e.state == RankState::working; });
        if (!all_working) throw RanksStopped{std::move(all)};
        return all;
    }

    /// The last exchange, from a rank that finished or failed.
    std::vector<Envelope> gather(const Envelope& mine) {
        std::vector<Envelope> all;
        boost::mpi::all_gather(world_, mine, all);
        return all;
    }

    const RankLoad& load() const { return load_; }
    int rank() const { return world_.rank(); }

private:
    boost::mpi::communicator world_;
    RankLoad load_;
};

/// The report of a check that stopped: failed, one consistency line per rank that did not keep
/// working, the same on every rank.
inline CheckReport stopped_report(const CheckOptions& options, const std::vector<Envelope>& envelopes) {
    CheckReport report;
    report.passed = false;
    report.mode = CheckMode::consistency;
    report.seed = options.seed;
    const auto working = std::find_if(envelopes.begin(), envelopes.end(),
                                      [](const Envelope& e) { return e.state == RankState::working; });
    for (std::size_t rank = 0; rank < envelopes.size(); ++rank) {
        const Envelope& e = envelopes[rank];
        if (e.state == RankState::failed) {
            report.consistency_failures.push_back(
                fmt::format("rank {} of {} threw: {}", rank, envelopes.size(), e.message));
        } else if (e.state == RankState::finished && working != envelopes.end()) {
            report.consistency_failures.push_back(fmt::format(
                "rank {} of {} finished its check while rank {} was still checking (the graph must be the same "
                "on every rank){}",
                rank, envelopes.size(), working - envelopes.begin(), e.message.empty() ? "" : ": " + e.message));
        }
    }
    return report;
}

}  // namespace detail

namespace detail {

/// A check with every rank of `world` taking a share of its finite differences: `run` runs it on
/// this rank with the given options and split. Every rank returns the same report; only rank 0
/// calls options.progress; `loads`, when given, receives each rank's RankLoad (zeros for a rank that
/// stopped early).
inline CheckReport check_over_ranks(const CheckOptions& options, const boost::mpi::communicator& world,
                                    std::vector<RankLoad>* loads,
                                    const std::function<CheckReport(const CheckOptions&, WorkSplit*)>& run) {
    CheckOptions on_this_rank = options;
    if (world.rank() != 0) on_this_rank.progress = {};
    MpiSplit split(world);
    CheckReport report;
    std::exception_ptr thrown;
    std::vector<Envelope> last;
    try {
        report = run(on_this_rank, &split);
        last = split.gather(Envelope{RankState::finished, report.passed ? "" : report.summary(), 0, {}, split.load()});
    } catch (const RanksStopped& stopped) {
        last = stopped.envelopes;
    } catch (...) {
        thrown = std::current_exception();
        last = split.gather(Envelope{RankState::failed, what_was_thrown(thrown), 0, {}, {}});
    }
    if (loads != nullptr) {
        loads->clear();
        for (const Envelope& e : last) loads->push_back(e.load);
    }
    const auto all_in = [&](RankState state) {
        return std::all_of(last.begin(), last.end(), [&](const Envelope& e) { return e.state == state; });
    };
    if (all_in(RankState::finished)) return report;
    if (thrown && all_in(RankState::failed)) std::rethrow_exception(thrown);
    return stopped_report(options, last);
}

}  // namespace detail

/// Checks the gradients of `graph` with every rank of `world` taking a share of the finite
/// differences (see the top of this file and detail::check_over_ranks).
template <std::size_t N, class Graph>
CheckReport check_gradients(Graph&& graph, const NamedTensor (&leaves)[N], const CheckOptions& options,
                            const boost::mpi::communicator& world, std::vector<RankLoad>* loads = nullptr) {
    const detail::GraphOnTapes on_tapes = detail::graph_on_tapes<N>(graph);
    return detail::check_over_ranks(options, world, loads, [&](const CheckOptions& o, detail::WorkSplit* split) {
        return detail::run_check(on_tapes, leaves, o, nullptr, split);
    });
}

/// The check of a recorded tape (check/recorded.hpp) over the ranks of `world`: every rank holds
/// the same recorded tape (each recorded it, or each loaded it).
template <Scalar S>
    requires std::same_as<S, double> || std::same_as<S, float>
CheckReport check_gradients(const Tape<S>& tape, const Var<S>& J, const CheckOptions& options,
                            const boost::mpi::communicator& world, std::vector<RankLoad>* loads = nullptr) {
    return detail::check_over_ranks(options, world, loads, [&](const CheckOptions& o, detail::WorkSplit* split) {
        return detail::check_recorded(tape, J, o, split);
    });
}

}  // namespace tapegrad
