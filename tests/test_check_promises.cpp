// The gradient checker's documented promises asserted where no other test made them bite (issue 49,
// item 2): the doc comments of check/gradcheck.hpp, check/report.hpp, check/recorded.hpp and
// check/second_order.hpp, each promise held on inputs built so that the promise decides the
// outcome (several coordinates and leaves, ties of errors, reductions beside elementwise ops, the
// first and the last node, a NaN error, threads). Each test names the promise it holds and why its
// inputs bite; the promises the older suites already hold (test_gradcheck, test_kinks,
// test_checker_consistency, test_rerun, test_second_order, test_fault_controls) are not repeated.
#define BOOST_TEST_MODULE check_promises
#include "support.hpp"

#include "autodiff/mp50.hpp"
#include "autodiff/rerun.hpp"
#include "check/gradcheck.hpp"
#include "check/recorded.hpp"
#include "check/second_order.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace tapegrad;
using tapegrad::testing::scalar_of;

namespace {

// Y = X, whose VJP is wrong by a factor growing with the element: dX[k] = (1 + k)·G[k]. Element 0
// is right, element k is off by k (the mixed error of a unit gradient): every failing coordinate
// has its own error, so the order of a report's worst list is decided by the promise alone.
struct IdentityWithGrowingError {
    static constexpr std::string_view name = "identity with a growing VJP error";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        out = *in[0];
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        for (std::size_t k = 0; k < at.G.size(); ++k) dX[k] = T(double(1 + k)) * at.G[k];
    }
};
const bool growing_registered = register_siblings<IdentityWithGrowingError>();

// A piecewise-linear elementwise op with a kink at 0: slope `left` below, `right` above, and the
// VJP's value `at_zero` at 0 itself (a subgradient convention, or a wrong one). The slopes are
// constants of the type `Slopes` so that each precision computes the same function (a type, not
// double template arguments: Clang 14, CI's sanitizer compiler, has no floating-point ones).
template <class Slopes>
struct Kinked {
    static constexpr double left = Slopes::left, right = Slopes::right, at_zero = Slopes::at_zero;
    static constexpr std::string_view name = "kinked slope";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        const Tensor<T>& x = *in[0];
        out.resize(x.shape());
        for (std::size_t k = 0; k < x.size(); ++k) out[k] = x[k] < 0 ? T(T(left) * x[k]) : T(T(right) * x[k]);
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dx) {
        const Tensor<T>& x = *at.in[0];
        for (std::size_t k = 0; k < x.size(); ++k) {
            const T slope = x[k] < 0 ? T(left) : x[k] > 0 ? T(right) : T(at_zero);
            dx[k] = slope * at.G[k];
        }
    }
};

// exp whose VJP is wrong by a relative `fault` in double only: right at 50 digits, so the 50-digit
// comparisons pass and only the double tape's comparison with the differences can see it.
template <class Fault>
struct ExpWrongInDouble : Exp {
    static constexpr double fault = Fault::value;
    static constexpr std::string_view name = "exp wrong in double";
    template <Scalar T>
    static void vjp(const NoSettings& s, const VjpArgs<T>& at, std::size_t which, Tensor<T>& dA) {
        Exp::vjp(s, at, which, dA);
        if constexpr (std::is_same_v<T, double>)
            for (double& d : dA.data()) d *= 1 + fault;
    }
};

// The faults and slopes the tests below instantiate those two ops with.
struct Fault1em7 { static constexpr double value = 1e-7; };
struct Fault1em12 { static constexpr double value = 1e-12; };
struct RightSlopeOff1em9 { static constexpr double left = 1.0, right = 1.0 + 1e-9, at_zero = 1.0; };
struct RightSlopeOff1em7 { static constexpr double left = 1.0, right = 1.0 + 1e-7, at_zero = 1.0; };
struct AbsAtZeroOff5em9 { static constexpr double left = -1.0, right = 1.0, at_zero = 1.0 + 5e-9; };
struct AbsAtZeroOff5em8 { static constexpr double left = -1.0, right = 1.0, at_zero = 1.0 + 5e-8; };
struct AbsAtZeroHalf { static constexpr double left = -1.0, right = 1.0, at_zero = 0.5; };

// Y = X whose VJP is linear in G except at G = 0, where it gives 1: right for every non-zero
// upstream gradient (so every finite difference agrees), wrong only in the consistency check's
// zero-seed backward.
struct IdentityNonZeroAtZeroSeed {
    static constexpr std::string_view name = "identity, non-zero at a zero seed";
    template <Scalar T>
    static void forward(const NoSettings&, Inputs<T> in, Tensor<T>& out, Tensor<T>&) {
        out = *in[0];
    }
    template <Scalar T>
    static void vjp(const NoSettings&, const VjpArgs<T>& at, std::size_t, Tensor<T>& dX) {
        const bool zero = std::all_of(at.G.data().begin(), at.G.data().end(), [](const T& g) { return g == T(0); });
        for (std::size_t k = 0; k < at.G.size(); ++k) dX[k] = zero ? T(1) : at.G[k];
    }
};

// exp whose tangent is doubled on every dual tape (the JVP checks' fault): the real tapes are right.
struct ExpWithDoubledTangent : Exp {
    static constexpr std::string_view name = "exp with a doubled tangent";
    template <Scalar T>
    static void forward(const NoSettings& s, Inputs<T> in, Tensor<T>& Y, Tensor<T>& saved) {
        Exp::forward(s, in, Y, saved);
        if constexpr (requires(T y) { y.tangent(); })
            for (T& y : Y.data()) y.tangent() *= 2;
    }
};

template <class Op, class V>
V unary(const V& X) {
    return X.tape().template record<Op>({X});
}

bool mentions(const std::string& text, const std::string& words) { return text.find(words) != std::string::npos; }

// The threads setting for one test, restored when it ends.
struct ThreadsFor {
    unsigned saved = thread_count();
    explicit ThreadsFor(unsigned threads) { set_threads(threads); }
    ~ThreadsFor() { set_threads(saved); }
};

// A report's text without the one figure that varies from run to run, the time it took.
std::string text_of(CheckReport report) {
    report.seconds = 0;
    return report.summary();
}

}  // namespace

// ---- check/gradcheck.hpp ----------------------------------------------------------------------------

// mixed_error is |a − n| / max(1, |n|): absolute where |n| ≤ 1, relative above, and relative to
// |n| for a negative n too (max(1, n) would divide by 1 there). Every value is exact in binary.
BOOST_AUTO_TEST_CASE(mixed_error_is_absolute_below_one_and_relative_above) {
    BOOST_TEST(mixed_error(mp50(0.75), mp50(0.5)) == 0.25);   // |n| < 1: absolute
    BOOST_TEST(mixed_error(mp50(1.5), mp50(1)) == 0.5);       // |n| = 1: either
    BOOST_TEST(mixed_error(mp50(6), mp50(4)) == 0.5);         // relative to 4
    BOOST_TEST(mixed_error(mp50(-6), mp50(-4)) == 0.5);       // relative to |−4|
    BOOST_TEST(mixed_error(mp50(-0.25), mp50(0.25)) == 0.5);  // absolute across zero
}

// random_unit_direction fills every part with ONE unit vector over all of them (‖v‖₂ = 1 summed
// over the parts, not per part: parts of 6 and 4 elements here), from the generator alone.
BOOST_AUTO_TEST_CASE(a_random_direction_is_one_unit_vector_over_all_its_parts) {
    std::vector<Tensor<mp50>> parts{Tensor<mp50>(Shape{2, 3}), Tensor<mp50>(Shape{4})};
    std::mt19937_64 generator(3);
    detail::random_unit_direction(generator, std::span<Tensor<mp50>>(parts));
    mp50 squared = 0, first_part = 0;
    for (const Tensor<mp50>& part : parts)
        for (const mp50& x : part.data()) squared += x * x;
    for (const mp50& x : parts[0].data()) first_part += x * x;
    // Each element is a double draw divided by the double norm: ‖v‖² is 1 to a few double roundings.
    BOOST_TEST(to_double(squared) == 1.0, boost::test_tools::tolerance(1e-14));
    BOOST_TEST(to_double(first_part) < 0.999);  // the first part alone is not the unit vector
    std::vector<Tensor<mp50>> again{Tensor<mp50>(Shape{2, 3}), Tensor<mp50>(Shape{4})};
    std::mt19937_64 same_seed(3);
    detail::random_unit_direction(same_seed, std::span<Tensor<mp50>>(again));
    BOOST_TEST((again[0] == parts[0] && again[1] == parts[1]));
}

// keep_worst keeps m among the `keep` worst, worst first, one line per place; a place's worse
// disagreement replaces its earlier one, an equal or smaller one leaves it (the earlier stays).
BOOST_AUTO_TEST_CASE(keep_worst_keeps_the_worst_per_place_worst_first) {
    struct Entry {
        std::string place;
        double rel_error;
        int order;  // when it was offered
    };
    std::vector<Entry> worst;
    const auto same = [](const Entry& a, const Entry& b) { return a.place == b.place; };
    const std::vector<Entry> offered{{"a", 0.5, 0}, {"b", 2.0, 1}, {"a", 0.25, 2}, {"c", 1.0, 3},
                                     {"a", 3.0, 4}, {"d", 0.1, 5}, {"c", 1.0, 6}, {"e", 1.5, 7}};
    for (const Entry& e : offered) detail::keep_worst(worst, e, 3, same);
    BOOST_TEST_REQUIRE(worst.size() == 3u);
    // a's 3.0 replaced its 0.5 (and its 0.25 never did); c's second 1.0 left the first; d fell out.
    BOOST_TEST(worst[0].place == "a");
    BOOST_TEST(worst[0].order == 4);
    BOOST_TEST(worst[1].place == "b");
    BOOST_TEST(worst[2].place == "e");
    std::vector<Entry> four;
    for (const Entry& e : offered) detail::keep_worst(four, e, 4, same);
    BOOST_TEST_REQUIRE(four.size() == 4u);
    BOOST_TEST(four[3].place == "c");
    BOOST_TEST(four[3].order == 3);  // the earlier of two equal disagreements
}

// The tally's comparison is written "error <= threshold passes", so a NaN error fails: the check
// fails, and the NaN is listed. (No graph makes a NaN error: the tape refuses NaN values and
// gradients, so the tally itself is held to it.)
BOOST_AUTO_TEST_CASE(a_nan_error_fails_the_tally) {
    detail::Tally tally(5);
    tally.add(Mismatch{"X", "(0, 0)", "", Source::mp_tape, 1, 1, 1e-14, 0, 1e-40, 1e-25});
    BOOST_TEST(!tally.failed);
    tally.add(Mismatch{"X", "(0, 1)", "", Source::mp_tape, 1, 1, 1e-14, 0, std::nan(""), 1e-25});
    BOOST_TEST(tally.failed);
    BOOST_TEST_REQUIRE(tally.worst.size() == 1u);
    BOOST_TEST(tally.worst[0].index == "(0, 1)");
}

// The differences are taken around finite values: a NaN in the LAST element of a leaf and a −inf
// in the FIRST element of the second leaf are each refused, by a value_error naming the leaf, the
// value and its index (a scan that stops one short, or starts at 1, misses them).
BOOST_AUTO_TEST_CASE(non_finite_values_at_the_first_and_last_element_are_refused_by_name_and_index) {
    const auto graph = [](auto in) {
        auto [X, Y] = in;
        return add(sum(X), sum(Y));
    };
    Tensor<double> X = Tensor<double>::matrix({{1, 2, 3}, {4, 5, 6}}), Y = Tensor<double>::matrix({{1, 2}});
    X[5] = std::nan("");
    const std::string last = testing::message_of<value_error>([&] { (void)check_gradients(graph, {{"X", X}, {"Y", Y}}); });
    BOOST_TEST(last == "gradcheck: leaf X has the non-finite value nan at (1, 2)");
    X[5] = 6;
    Y[0] = -std::numeric_limits<double>::infinity();
    const std::string first = testing::message_of<value_error>([&] { (void)check_gradients(graph, {{"X", X}, {"Y", Y}}); });
    BOOST_TEST(first == "gradcheck: leaf Y has the non-finite value -inf at (0, 0)");
}

// The report keeps the `max_reported` worst mismatches, worst first, one line per coordinate (a
// coordinate fails at both steps and in both precisions: four comparisons, one line), and counts
// every failing coordinate once. Six coordinates with errors 0..5 (IdentityWithGrowingError), three
// kept: (1, 2), (1, 1), (1, 0) in that order; five failures of six derivatives.
BOOST_AUTO_TEST_CASE(the_worst_mismatches_are_the_worst_coordinates_worst_first_one_line_each) {
    CheckOptions options;
    options.max_reported = 3;
    const CheckReport report = check_gradients(
        [](auto in) { return sum(unary<IdentityWithGrowingError>(in[0])); },
        {{"X", Tensor<double>::matrix({{0.5, -1, 2}, {1.5, 3, -0.25}})}}, options);
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.coordinates == 6u);
    BOOST_TEST(report.failures == 5u);
    BOOST_TEST_REQUIRE(report.worst.size() == 3u);
    const std::vector<std::string> expected{"(1, 2)", "(1, 1)", "(1, 0)"};
    for (std::size_t i = 0; i < 3; ++i) {
        BOOST_TEST(report.worst[i].index == expected[i]);
        BOOST_TEST(report.worst[i].rel_error == double(5 - i), boost::test_tools::tolerance(1e-12));
    }
    BOOST_TEST(report.max_error_mp == 5.0, boost::test_tools::tolerance(1e-12));
}

// "the report depends on neither the threads nor the processes": a report with failures, kinks,
// branches and a worst list, made at 1, 2 and 3 threads, is the same text (the time aside). Enough
// coordinates (two 4x5 leaves) that each thread takes several.
BOOST_AUTO_TEST_CASE(the_report_is_the_same_at_any_number_of_threads) {
    std::mt19937_64 rng(17);
    Tensor<double> X = testing::random_tensor({4, 5}, rng), W = testing::random_tensor({5, 5}, rng);
    X[3] = 0, X[11] = 0, X[19] = 0;  // abs at zeros: kinks, the first, a middle and the last row
    const auto graph = [](auto in) {
        auto [X, W] = in;
        return add(sum(abs(X)), sum(unary<IdentityWithGrowingError>(matmul(X, W))));
    };
    CheckOptions options;
    options.max_reported = 4;
    std::vector<std::string> texts;
    for (const unsigned threads : {1u, 2u, 3u}) {
        const ThreadsFor setting(threads);
        const CheckReport report = check_gradients(graph, {{"X", X}, {"W", W}}, options);
        BOOST_TEST(!report.passed);
        BOOST_TEST(!report.first_kinks.empty());  // the abs branch's kinks at least
        BOOST_TEST(report.branches.size() == 2u);
        texts.push_back(text_of(report));
    }
    BOOST_TEST(texts[1] == texts[0]);
    BOOST_TEST(texts[2] == texts[0]);
}

// CheckOptions::progress: called after each finite difference this process takes, from one thread
// (the checker's first, the caller), never at the same time; it changes nothing in the report.
// At one thread the calls count 1..N of N ("done" of "mine", all N); at two threads the caller's
// calls still count up, and every call comes from the calling thread. At both, the last call
// counts all N, whichever thread took the last derivative (tapegrad-check prints that line
// always: its progress lines, at most one every two seconds, and the last).
BOOST_AUTO_TEST_CASE(progress_is_reported_from_the_calling_thread_and_changes_nothing) {
    std::mt19937_64 rng(19);
    const NamedTensor leaves[] = {{"X", testing::random_tensor({6, 8}, rng)}, {"W", testing::random_tensor({8, 8}, rng)}};
    const auto graph = [](auto in) {
        auto [X, W] = in;
        return sum(exp(scale(matmul(X, W), scalar_of<decltype(X)>(0.25))));
    };
    const std::size_t derivatives = 48 + 64;
    struct Call {
        std::string stage;
        std::size_t done, mine, all;
        double seconds;
        std::thread::id thread;
    };
    for (const unsigned threads : {1u, 2u}) {
        BOOST_TEST_CONTEXT(threads << " threads") {
            const ThreadsFor setting(threads);
            std::vector<Call> calls;
            std::mutex inside;
            bool overlapped = false;
            CheckOptions options;
            options.progress = [&](const CheckProgress& p) {
                std::unique_lock lock(inside, std::try_to_lock);
                if (!lock.owns_lock()) overlapped = true;
                calls.push_back({std::string(p.stage), p.done, p.mine, p.all, p.seconds, std::this_thread::get_id()});
            };
            const CheckReport reported = check_gradients(graph, leaves, options);
            const CheckReport silent = check_gradients(graph, leaves);
            BOOST_TEST(text_of(reported) == text_of(silent));
            BOOST_TEST(!overlapped);
            BOOST_TEST_REQUIRE(!calls.empty());
            if (threads == 1) BOOST_TEST(calls.size() == derivatives);
            BOOST_TEST(calls.back().done == derivatives);
            for (std::size_t i = 0; i < calls.size(); ++i) {
                BOOST_TEST(calls[i].stage == "full check");
                BOOST_TEST(calls[i].thread == std::this_thread::get_id());
                BOOST_TEST((calls[i].mine == derivatives && calls[i].all == derivatives));
                BOOST_TEST(calls[i].done <= derivatives);
                if (threads == 1) BOOST_TEST(calls[i].done == i + 1);
                if (i > 0) BOOST_TEST((calls[i].done > calls[i - 1].done && calls[i].seconds >= calls[i - 1].seconds));
            }
        }
    }
}

// CheckOptions::progress over several stages: X feeds matmul and exp, so the check has its main stage
// ("full check" or "fast check") and a stage per branch of X. Each stage's calls count up from the
// start of that stage with its seconds since the stage began, and each stage's last call counts its
// whole share (done == mine == all, one process), at one and two threads, in both modes: not only
// the first stage.
BOOST_AUTO_TEST_CASE(progress_ends_every_stage_with_its_whole_share) {
    std::mt19937_64 rng(31);
    const NamedTensor leaves[] = {{"X", testing::random_tensor({3, 4}, rng)},
                                  {"W", testing::random_tensor({4, 4}, rng)}};
    const auto graph = [](auto in) {
        auto [X, W] = in;
        return sum(exp(scale(matmul(X, W), scalar_of<decltype(X)>(0.25)))) + sum(exp(X));
    };
    for (const CheckOptions::Mode mode : {CheckOptions::Mode::full, CheckOptions::Mode::fast}) {
        for (const unsigned threads : {1u, 2u}) {
            BOOST_TEST_CONTEXT((mode == CheckOptions::Mode::full ? "full" : "fast") << ", " << threads << " threads") {
                const ThreadsFor setting(threads);
                std::vector<CheckProgress> calls;
                std::vector<std::string> stages;  // CheckProgress::stage views a string the check owns
                CheckOptions options;
                options.mode = mode;
                options.progress = [&](const CheckProgress& p) {
                    calls.push_back(p);
                    stages.emplace_back(p.stage);
                };
                const CheckReport report = check_gradients(graph, leaves, options);
                BOOST_TEST_REQUIRE(report.passed, report.summary());
                BOOST_TEST_REQUIRE(!calls.empty());
                BOOST_TEST(stages.front() == (mode == CheckOptions::Mode::full ? "full check" : "fast check"));
                std::size_t stage_count = 0, branch_stages = 0;
                for (std::size_t i = 0; i < calls.size(); ++i) {
                    const bool first = i == 0 || stages[i] != stages[i - 1];
                    const bool last = i + 1 == calls.size() || stages[i + 1] != stages[i];
                    stage_count += first;
                    branch_stages += first && stages[i].starts_with("branch X via ");
                    BOOST_TEST(calls[i].mine == calls[i].all, stages[i]);
                    BOOST_TEST(calls[i].done <= calls[i].mine, stages[i]);
                    if (!first) {
                        BOOST_TEST(calls[i].done > calls[i - 1].done, stages[i] << ", call " << i);
                        BOOST_TEST(calls[i].seconds >= calls[i - 1].seconds, stages[i] << ", call " << i);
                    }
                    if (last) {
                        BOOST_TEST(calls[i].done == calls[i].mine, stages[i] << ": its last call");
                        // 50-digit finite differences take far longer than the clock's tick.
                        BOOST_TEST(calls[i].seconds > 0.0, stages[i] << ": its last call's seconds");
                    }
                }
                BOOST_TEST(branch_stages == 2u);  // X via matmul and via exp
                BOOST_TEST(stage_count == 1 + branch_stages);
            }
        }
    }
}

// Fast mode compares `directions` directional derivatives (5 here, not the default 3), and the
// report carries the seed it drew them from.
BOOST_AUTO_TEST_CASE(fast_mode_compares_as_many_directions_as_asked_from_the_seed_given) {
    CheckOptions options;
    options.mode = CheckOptions::Mode::fast;
    options.directions = 5;
    options.seed = 4242;
    std::mt19937_64 rng(23);
    const CheckReport report = check_gradients([](auto in) { return sum(exp(in[0])); },
                                               {{"X", testing::random_tensor({3, 3}, rng)}}, options);
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.mode == CheckMode::fast);
    BOOST_TEST(report.coordinates == 5u);
    BOOST_TEST(report.seed == 4242u);
    BOOST_TEST(mentions(report.summary(), "(fast mode, seed 4242): 0 of 5 derivatives"), report.summary());
}

// A leaf that feeds several ops is checked branch by branch, each consumer named "op -> label
// (input slot)", or "op -> node N" when unlabelled: X read twice by one mul (slots 0 and 1, two
// branches of one node) and once by a labelled matmul. W, read once, has no branches. With
// check_branches off there are none at all.
BOOST_AUTO_TEST_CASE(branches_are_named_by_consumer_label_or_node_and_slot) {
    const auto graph = [](auto in) {
        auto [X, W] = in;
        const auto square = mul(X, X);
        return add(sum(square), sum(matmul(X, W).named("Q")));
    };
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{0.5, -1}, {2, 0.25}})},
                                  {"W", Tensor<double>::matrix({{1, 2}, {-0.5, 1.5}})}};
    const CheckReport report = check_gradients(graph, leaves);
    BOOST_TEST(report.passed, report.summary());
    std::set<std::string> names;
    for (const BranchReport& b : report.branches) {
        BOOST_TEST(b.leaf == "X");
        names.insert(b.consumer);
    }
    BOOST_TEST(report.branches.size() == 3u);
    BOOST_TEST((names == std::set<std::string>{"mul -> node 2 (input 0)", "mul -> node 2 (input 1)",
                                                "matmul -> Q (input 0)"}));
    CheckOptions no_branches;
    no_branches.check_branches = false;
    const CheckReport without = check_gradients(graph, leaves, no_branches);
    BOOST_TEST(without.passed, without.summary());
    BOOST_TEST(without.branches.empty());
}

// check_consistency off: the backward-twice and zero-seed checks do not run. An op that is right
// at every non-zero seed and wrong only at a zero one fails with them and passes without them.
BOOST_AUTO_TEST_CASE(the_consistency_checks_run_only_when_asked) {
    const auto graph = [](auto in) { return sum(unary<IdentityNonZeroAtZeroSeed>(in[0])); };
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{1, 2}})}};
    const CheckReport with = check_gradients(graph, leaves);
    BOOST_TEST(!with.passed);
    BOOST_TEST_REQUIRE(with.consistency_failures.size() == 1u);
    BOOST_TEST(with.consistency_failures[0] == "a zero upstream gradient gave a non-zero gradient for X");
    CheckOptions off;
    off.check_consistency = false;
    const CheckReport without = check_gradients(graph, leaves, off);
    BOOST_TEST(without.passed, without.summary());
    BOOST_TEST(without.consistency_failures.empty());
}

// A hand-derived backward replaces the tape's gradients: branches are known from the tape only (X
// feeds two ops, and no branch is reported), and the tape's consistency checks do not run (the
// graph's op fails them). A backward returning the wrong number of gradients, or one of the wrong
// shape, is refused by name.
BOOST_AUTO_TEST_CASE(a_hand_derived_backward_has_no_branches_and_is_held_to_its_leaves) {
    const auto graph = [](auto in) {
        auto [X, W] = in;
        return add(sum(unary<IdentityNonZeroAtZeroSeed>(X)), sum(mul(X, W)));
    };
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{1, 2}})}, {"W", Tensor<double>::matrix({{3, -4}})}};
    // dJ/dX = 1 + W, dJ/dW = X
    const auto right = [](const auto& v) {
        auto dX = v[1];
        for (auto& x : dX.data()) x += 1;
        return std::array{dX, v[0]};
    };
    const CheckReport hand = check_gradients(graph, leaves, CheckOptions{}, right);
    BOOST_TEST(hand.passed, hand.summary());
    BOOST_TEST(hand.branches.empty());
    BOOST_TEST(hand.consistency_failures.empty());
    BOOST_TEST(!check_gradients(graph, leaves).passed);  // from the tape: the zero-seed check fails

    const auto one = [](const auto& v) { return std::array{v[0]}; };
    const std::string count = testing::message_of<usage_error>([&] { (void)check_gradients(graph, leaves, {}, one); });
    BOOST_TEST(count == "gradcheck: the hand-derived backward returned 1 gradients for 2 leaves");
    const auto transposed = [](const auto& v) {
        using T = typename std::decay_t<decltype(v[0])>::value_type;
        return std::array{v[0], Tensor<T>(Shape{2, 1})};
    };
    const std::string shape = testing::message_of<shape_error>([&] { (void)check_gradients(graph, leaves, {}, transposed); });
    BOOST_TEST(shape == "gradcheck: the hand-derived gradient of W has shape [2x1], the leaf [1x2]");
}

// The plan: one group per leaf's coordinates and one per branch of a leaf that feeds several ops,
// each group's cost the work (multiply-adds and output elements) of every node downstream of the
// moved leaf, summed over the group; `samples` derivatives measured, or all of a smaller group;
// the prediction Σ derivatives × cpu_seconds_each. X feeds mul twice and Y only exp, so their
// downstream nodes differ: a cost of every node would make both groups' per-derivative costs equal.
BOOST_AUTO_TEST_CASE(the_plan_costs_each_group_by_its_downstream_nodes) {
    const auto graph = [](auto in) {
        auto [X, Y] = in;
        const auto squares = sum(mul(X, X));
        return add(squares, sum(exp(Y)));
    };
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{0.5, -1}, {2, 0.25}})},
                                  {"Y", Tensor<double>::matrix({{0.125}})}};
    const CheckPlan plan = plan_check(graph, leaves, {}, 3);
    // The same graph on a double tape: the nodes each leaf reaches, and their work.
    Tape<double> tape;
    const std::array<Var<double>, 2> vars{tape.leaf(leaves[0].value, "X"), tape.leaf(leaves[1].value, "Y")};
    const Var<double> J = graph(vars);
    const auto downstream_work = [&](std::uint32_t leaf) {
        std::vector<char> reached(J.index() + 1, 0);
        double work = 0;
        for (std::uint32_t i = 0; i <= J.index(); ++i) {
            const NodeInfo node = tape.info(i);
            for (const std::uint32_t input : node.inputs) reached[i] = reached[i] || reached[input] || input == leaf;
            if (reached[i]) work += double(node.cost.forward_madds + node.shape.size());
        }
        return work;
    };
    BOOST_TEST_REQUIRE(plan.groups.size() == 4u);  // X, X via mul's input 0 and 1, Y
    const double x_each = downstream_work(vars[0].index()), y_each = downstream_work(vars[1].index());
    BOOST_TEST(x_each != y_each);
    for (std::size_t g = 0; g < 3; ++g) {
        BOOST_TEST(plan.groups[g].leaf == "X");
        BOOST_TEST(plan.groups[g].branch == (g > 0));
        BOOST_TEST(plan.groups[g].derivatives == 4u);
        BOOST_TEST(plan.groups[g].samples == 3u);
        BOOST_TEST(plan.groups[g].cost == 4 * x_each);  // mul is X's only consumer: each branch reaches the same
    }
    BOOST_TEST(plan.groups[3].leaf == "Y");
    BOOST_TEST(plan.groups[3].derivatives == 1u);
    BOOST_TEST(plan.groups[3].samples == 1u);  // all of a group smaller than `samples`
    BOOST_TEST(plan.groups[3].cost == y_each);
    double predicted = 0;
    for (const CheckPlan::Group& g : plan.groups) predicted += double(g.derivatives) * g.cpu_seconds_each;
    BOOST_TEST(plan.predicted_cpu_seconds() == predicted);
    BOOST_TEST(plan.cost() == 12 * x_each + y_each);
}

// ---- check/report.hpp: steps, tolerances, kinks ------------------------------------------------

// The two steps must agree with each other: J = x³ at x = 1 with steps 1e-4 and 1e-16. The central
// difference at 1e-4 is exactly 3 + h² = 3 + 1e-8, at 1e-16 3 to 1e-32. The step-agreement line
// compares them as the report says: "analytic" the difference at steps[0], "numeric" the one at
// steps[1], step steps[1], mixed error 1e-8/3; it is the coordinate's worst disagreement (the tape
// against steps[0] is 1e-8/(3 + 1e-8)) and the report's max step disagreement.
BOOST_AUTO_TEST_CASE(differences_that_have_not_converged_fail_on_step_agreement) {
    CheckOptions options;
    options.steps = {1e-4, 1e-16};
    const CheckReport report = check_gradients([](auto in) { return sum(mul(mul(in[0], in[0]), in[0])); },
                                               {{"x", Tensor<double>::matrix({{1.0}})}}, options);
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.failures == 1u);
    BOOST_TEST_REQUIRE(report.worst.size() == 1u);
    const Mismatch& m = report.worst[0];
    const double h2 = 1e-4 * 1e-4;  // the step as a double, squared: to 1e-24 of 1e-8
    BOOST_TEST(m.source == Source::step_agreement);
    BOOST_TEST(m.analytic == 3 + h2, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(m.numeric == 3.0, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(m.step == 1e-16);
    BOOST_TEST(m.rel_error == h2 / 3, boost::test_tools::tolerance(1e-6));
    BOOST_TEST(report.max_step_disagreement == h2 / 3, boost::test_tools::tolerance(1e-6));
}

// The double tape is held to double_tolerance (1e-9) against the 50-digit differences: a VJP wrong
// by 1e-7 in double only fails there, as a double-tape mismatch, while every 50-digit comparison
// passes; wrong by 1e-12 (below the tolerance, above a double's rounding) it passes.
BOOST_AUTO_TEST_CASE(a_fault_in_the_double_tape_only_fails_on_double_tolerance) {
    std::mt19937_64 rng(29);
    const NamedTensor leaves[] = {{"X", testing::random_tensor({2, 3}, rng)}};
    const CheckReport wrong = check_gradients([](auto in) { return sum(unary<ExpWrongInDouble<Fault1em7>>(in[0])); }, leaves);
    BOOST_TEST(!wrong.passed);
    BOOST_TEST(wrong.failures == 6u);
    BOOST_TEST(wrong.max_error_mp <= 1e-25);
    BOOST_TEST(wrong.max_error_double > 1e-8);
    BOOST_TEST_REQUIRE(!wrong.worst.empty());
    for (const Mismatch& m : wrong.worst) {
        BOOST_TEST(m.source == Source::double_tape);
        BOOST_TEST(m.threshold == 1e-9);
    }
    const CheckReport close = check_gradients([](auto in) { return sum(unary<ExpWrongInDouble<Fault1em12>>(in[0])); }, leaves);
    BOOST_TEST(close.passed, close.summary());
    BOOST_TEST(close.max_error_double > 1e-13);  // the fault is seen, and within the tolerance
}

// A jump of the derivative below kink_threshold (1e-8) is no kink: slopes 1 and 1 + 1e-9 at 0, the
// VJP saying 1 there, is compared as usual with the central difference 1 + 5e-10, and fails on the
// 50-digit tolerance. Slopes 1 and 1 + 1e-7 part by more than the threshold: a kink, which passes.
BOOST_AUTO_TEST_CASE(a_jump_below_the_kink_threshold_is_compared_as_usual) {
    const NamedTensor leaves[] = {{"x", Tensor<double>::matrix({{0.0, 0.5}})}};
    const CheckReport small = check_gradients([](auto in) { return sum(unary<Kinked<RightSlopeOff1em9>>(in[0])); }, leaves);
    BOOST_TEST(!small.passed);
    BOOST_TEST(small.kinks == 0u);
    BOOST_TEST(small.failures == 1u);
    BOOST_TEST_REQUIRE(small.worst.size() == 1u);
    BOOST_TEST(small.worst[0].index == "(0, 0)");
    BOOST_TEST(small.worst[0].source == Source::mp_tape);
    BOOST_TEST(small.worst[0].numeric == 1 + 5e-10, boost::test_tools::tolerance(1e-12));
    const CheckReport large = check_gradients([](auto in) { return sum(unary<Kinked<RightSlopeOff1em7>>(in[0])); }, leaves);
    BOOST_TEST(large.passed, large.summary());
    BOOST_TEST(large.kinks == 1u);
}

// A kink needs each one-sided difference to agree with itself across the two steps (converged).
// |x| at x = 5e-17, half the smaller step: both steps straddle the kink, so the sides part at both,
// but the left side is (2x − h)/h = −0.99 at h = 1e-14 and 0 at 1e-16: not converged, so no kink;
// the central differences (x/h: 5e-3 and 0.5) then miss the slope 1 and the coordinate fails.
BOOST_AUTO_TEST_CASE(one_sided_differences_that_have_not_converged_are_no_kink) {
    const CheckReport report = check_gradients([](auto in) { return sum(abs(in[0])); },
                                               {{"x", Tensor<double>::matrix({{5e-17, 1.0}})}});
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.kinks == 0u);
    BOOST_TEST(report.failures == 1u);
    BOOST_TEST_REQUIRE(report.worst.size() == 1u);
    BOOST_TEST(report.worst[0].index == "(0, 0)");
}

// At a kink the analytic value may lie anywhere between the one-sided derivatives, within
// kink_threshold beyond either: |x| (sides −1 and 1) whose VJP says 1 + 5e-9 at 0 is a kink; one
// saying 1 + 5e-8 is a failure, measured against the nearer side (1).
BOOST_AUTO_TEST_CASE(an_analytic_value_just_beyond_a_side_is_a_kink_within_the_threshold_only) {
    const NamedTensor leaves[] = {{"x", Tensor<double>::matrix({{-0.5, 0.0}})}};
    const CheckReport within =
        check_gradients([](auto in) { return sum(unary<Kinked<AbsAtZeroOff5em9>>(in[0])); }, leaves);
    BOOST_TEST(within.passed, within.summary());
    BOOST_TEST(within.kinks == 1u);
    const CheckReport beyond =
        check_gradients([](auto in) { return sum(unary<Kinked<AbsAtZeroOff5em8>>(in[0])); }, leaves);
    BOOST_TEST(!beyond.passed);
    BOOST_TEST(beyond.kinks == 0u);
    BOOST_TEST_REQUIRE(beyond.worst.size() == 1u);
    BOOST_TEST(beyond.worst[0].source == Source::mp_tape_at_kink);
    BOOST_TEST(beyond.worst[0].numeric == 1.0, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(beyond.worst[0].threshold == 1e-8);
}

// A kink is kept out of the max errors: |x| whose VJP says 0.5 at 0 (a valid subgradient, far from
// the central difference 0) reports both max errors at a smooth coordinate's size, not 0.5. The
// kink lists the one-sided derivatives at steps[1] and the 50-digit tape's 0.5.
BOOST_AUTO_TEST_CASE(a_kink_is_kept_out_of_the_max_errors) {
    const CheckReport report = check_gradients([](auto in) { return sum(unary<Kinked<AbsAtZeroHalf>>(in[0])); },
                                               {{"x", Tensor<double>::matrix({{0.0, 2.0, -3.0}})}});
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.kinks == 1u);
    BOOST_TEST(report.max_error_mp <= 1e-25);
    BOOST_TEST(report.max_error_double <= 1e-9);
    BOOST_TEST(report.max_step_disagreement <= 1e-25);
    BOOST_TEST_REQUIRE(report.first_kinks.size() == 1u);
    BOOST_TEST(report.first_kinks[0].analytic == 0.5);
    BOOST_TEST(report.first_kinks[0].left == -1.0, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(report.first_kinks[0].right == 1.0, boost::test_tools::tolerance(1e-12));
}

// first_kinks: the first max_reported kinks in the order compared (leaf by leaf, coordinate by
// coordinate), while `kinks` counts them all; at 1 and at 3 threads alike. Five kinks over two
// leaves, three kept: X's (0, 1), (1, 0), (1, 2) (X's last element among them), none of Y's.
BOOST_AUTO_TEST_CASE(the_first_kinks_listed_are_the_first_compared) {
    Tensor<double> X = Tensor<double>::matrix({{1, 0, 2}, {0, -1, 0}}), Y = Tensor<double>::matrix({{0, 3, 0}});
    CheckOptions options;
    options.max_reported = 3;
    for (const unsigned threads : {1u, 3u}) {
        const ThreadsFor setting(threads);
        const CheckReport report = check_gradients(
            [](auto in) {
                auto [X, Y] = in;
                return add(sum(abs(X)), sum(abs(Y)));
            },
            {{"X", X}, {"Y", Y}}, options);
        BOOST_TEST(report.passed, report.summary());
        BOOST_TEST(report.kinks == 5u);
        BOOST_TEST_REQUIRE(report.first_kinks.size() == 3u);
        const std::vector<std::string> expected{"(0, 1)", "(1, 0)", "(1, 2)"};
        for (std::size_t i = 0; i < 3; ++i) {
            BOOST_TEST(report.first_kinks[i].leaf == "X");
            BOOST_TEST(report.first_kinks[i].index == expected[i]);
        }
    }
}

// ---- check/recorded.hpp --------------------------------------------------------------------------

// A recorded tape's checked leaves are its leaves that need a gradient, named by their labels or
// "leaf N" (N its node) when unnamed; its constants stay constants (not perturbed, not counted).
// Constant C is node 0, leaf A node 1, the unnamed leaf node 2 (its position among the leaves is 1,
// so a name by position would say "leaf 1").
BOOST_AUTO_TEST_CASE(a_recorded_tapes_leaves_are_named_by_label_or_node_and_constants_are_not_checked) {
    BOOST_TEST(growing_registered);
    Tape<double> tape;
    const Var<double> C = tape.constant(Tensor<double>::matrix({{2, -3}}), "C");
    const Var<double> A = tape.leaf(Tensor<double>::matrix({{0.5, 1.5}}), "A");
    const Var<double> U = tape.leaf(Tensor<double>::matrix({{-1, 0.25}}));
    const Var<double> J = sum(tape.record<IdentityWithGrowingError>({add(mul(A, C), U)}));
    const CheckReport report = check_gradients(tape, J);
    BOOST_TEST(!report.passed);
    BOOST_TEST(report.coordinates == 4u);  // A's two and the unnamed leaf's two: C's are not
    std::set<std::string> failing;
    for (const Mismatch& m : report.worst) failing.insert(m.leaf + " " + m.index);
    BOOST_TEST((failing == std::set<std::string>{"A (0, 1)", "leaf 2 (0, 1)"}));
}

// A BranchChange counts its elements "of the node's output elements": for a reduction (max over
// the rows of a 3x2 input) that is the output's 2, not the input's 6; `first` is an index of the
// output and `recorded` the maximum. Column 0 ties in double (1 + 1 against 2 + 1e-17, which rounds
// to 2) and not at 50 digits, column 1 (5, 3, 1) has no tie.
BOOST_AUTO_TEST_CASE(a_reductions_branch_change_counts_its_output_elements) {
    Tape<double> tape;
    const Var<double> x = tape.leaf(Tensor<double>::matrix({{1, 5}, {2, 3}, {0, 1}}), "x");
    const Var<double> c = tape.constant(Tensor<double>::matrix({{1, 0}, {1e-17, 0}, {0, 0}}));
    const Var<double> m = max(add(x, c), 0).named("m");
    const CheckReport report = check_gradients(tape, sum(m));
    BOOST_TEST_REQUIRE(report.branch_changes.size() == 1u);
    const BranchChange& change = report.branch_changes[0];
    BOOST_TEST(change.node == m.index());
    BOOST_TEST(change.op == "max");
    BOOST_TEST(change.label == "m");
    BOOST_TEST(change.elements == 1u);
    BOOST_TEST(change.of == 2u);
    BOOST_TEST(change.first == index_string(m.shape(), 0));
    BOOST_TEST(change.recorded == 2.0);
    BOOST_TEST(change.precise == 2.0);  // 2 + 1e-17, the 50-digit maximum, to the nearest double
}

// The branch report goes through the last node too: J itself a relu whose input is 0 in double and
// −1e-17 at 50 digits ((x + b) − x, b lost to rounding), a scalar of one element. The first node
// is a leaf, which takes no branch.
BOOST_AUTO_TEST_CASE(a_branch_change_at_the_output_node_is_reported) {
    Tape<double> tape;
    const Var<double> x = tape.leaf(Tensor<double>(Shape{1}, 1.0), "x");
    const Var<double> J = relu(sub(add(x, tape.constant(Tensor<double>(Shape{1}, -1e-17))), x));
    const CheckReport report = check_gradients(tape, J);
    BOOST_TEST_REQUIRE(report.branch_changes.size() == 1u);
    BOOST_TEST(report.branch_changes[0].node == J.index());
    BOOST_TEST(report.branch_changes[0].node == tape.size() - 1);
    BOOST_TEST(report.branch_changes[0].op == "relu");
    BOOST_TEST(report.branch_changes[0].label == "");
    BOOST_TEST((report.branch_changes[0].elements == 1u && report.branch_changes[0].of == 1u));
    BOOST_TEST(mentions(report.summary(), fmt::format("node {} (relu): 1 of 1 elements", J.index())), report.summary());
}

// ---- check/second_order.hpp and SecondOrderReport ------------------------------------------------

// The JVP report: its check's name, seed and directions; `compared` counts every entry of J·t
// compared, per direction, per step and per precision, and the transpose identity once per
// direction (2 directions × (2 steps × 3 entries × 2 precisions + 1) = 26; 14 with the 50-digit
// dual tape only, whose max double error stays 0, "not run"). A doubled tangent fails every
// comparison, and the worst list keeps one line per place (3 entries and the identity per
// direction: 8 places, each failing in 4 or 1 comparisons).
BOOST_AUTO_TEST_CASE(the_jvp_report_counts_every_comparison_and_lists_each_place_once) {
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{0.3, -0.7, 1.1}})}};
    CheckOptions options;
    options.directions = 2;
    options.seed = 99;
    options.max_reported = 10;
    const auto right = [](auto in) { return exp(in[0]); };
    const SecondOrderReport both = check_jvp(right, leaves, options);
    BOOST_TEST(both.passed, both.summary());
    BOOST_TEST(both.check == "jvp");
    BOOST_TEST((both.seed == 99u && both.directions == 2u));
    BOOST_TEST(both.compared == 26u);
    BOOST_TEST(both.max_error_double > 0.0);  // exp in double rounds
    const SecondOrderReport mp_only = check_jvp<DualTapes::mp_only>(right, leaves, options);
    BOOST_TEST(mp_only.passed, mp_only.summary());
    BOOST_TEST(mp_only.compared == 14u);
    BOOST_TEST(mp_only.max_error_double == 0.0);

    const SecondOrderReport wrong = check_jvp([](auto in) { return unary<ExpWithDoubledTangent>(in[0]); }, leaves, options);
    BOOST_TEST(!wrong.passed);
    BOOST_TEST(wrong.failures == 26u);
    BOOST_TEST_REQUIRE(wrong.worst.size() == 8u);
    std::set<std::string> places;
    for (const SecondOrderMismatch& m : wrong.worst) places.insert(m.where);
    BOOST_TEST(places.size() == 8u);
    BOOST_TEST(places.contains("direction 1, output Y index (0, 0)"));
    BOOST_TEST(places.contains("direction 2, transpose identity"));
    for (std::size_t i = 1; i < wrong.worst.size(); ++i) BOOST_TEST(wrong.worst[i - 1].rel_error >= wrong.worst[i].rel_error);
}

// The HVP report compares H·v per leaf coordinate, per direction, step and precision (3 directions
// × 2 steps × (4 + 2 coordinates) × 2 precisions = 72), each place named by its leaf and index.
BOOST_AUTO_TEST_CASE(the_hvp_report_compares_every_leaf_coordinate) {
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{0.3, -0.7}, {1.1, 0.2}})},
                                  {"W", Tensor<double>::matrix({{0.5}, {-1.5}})}};
    const auto graph = [](auto in) {
        auto [X, W] = in;
        return sum(exp(matmul(X, W)));
    };
    const SecondOrderReport report = check_hvp(graph, leaves);
    BOOST_TEST(report.passed, report.summary());
    BOOST_TEST(report.check == "hvp");
    BOOST_TEST(report.directions == 3u);
    BOOST_TEST(report.compared == 72u);
    BOOST_TEST(mentions(report.summary(), "hvp check passed (seed 20261129, 3 directions): 0 of 72 derivatives"),
               report.summary());
}
