// The thread pool behind parallel_for (autodiff/parallel.hpp, src/autodiff/parallel.cpp): workers are
// reused across calls (a variant that starts threads per call is rejected by the same check),
// the first exception reaches the caller and stops the hand-out, nested calls run inline, the
// threads setting is obeyed, several user threads may call parallel_for at once, the fused op's
// in-order dQ turns sleep and can be called off; and independent tapes recorded and
// differentiated on several threads at once give bit for bit the results of one after the other.
// parallel_chunks at odd and prime counts on 2 to 4 threads visits every index exactly once, and
// its users (softmax's rows, scale, mask, the tape's NaN scan) reach the last row or element.
// Also built under ThreadSanitizer (.ci/run).
#define BOOST_TEST_MODULE threads
#include "support.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace tapegrad;
using namespace std::chrono_literals;

namespace {

// Puts the threads setting back to the default (every core) when a test ends, even by a failure.
struct ThreadsSetting {
    explicit ThreadsSetting(unsigned threads) { set_threads(threads); }
    ~ThreadsSetting() { set_threads(0); }
    ThreadsSetting(const ThreadsSetting&) = delete;
    ThreadsSetting& operator=(const ThreadsSetting&) = delete;
};

// A number for the calling thread, new for every thread ever started. (std::thread::id will not
// do: the C library reuses a finished thread's stack, and with it the id, for the next thread.)
std::size_t thread_serial() {
    static std::atomic<std::size_t> next{0};
    thread_local const std::size_t serial = next++;
    return serial;
}

// Items 0 and 1 of a call wait for each other (up to 10 s): the thread that took item 0 holds it
// until another thread has taken item 1, so a call that can use two threads does, however loaded
// the machine (no sleeps to tune). A call confined to one thread runs them one after the other.
void meet_partner(std::size_t item, std::atomic<int>& arrived) {
    if (item >= 2) return;
    ++arrived;
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(20us);
}

// Fault control for the reuse check: the previous parallel_for, which started its threads anew
// for every call (kept here only to prove the check below tells the two apart).
template <class Work>
void parallel_for_spawning_threads(std::size_t count, const Work& work, unsigned threads) {
    std::atomic<std::size_t> next{0};
    const auto run = [&](unsigned thread) {
        for (std::size_t item; (item = next++) < count;) work(item, thread);
    };
    std::vector<std::jthread> started;
    for (unsigned t = 1; t < threads; ++t) started.emplace_back(run, t);
    run(0);
}

// The distinct threads that ran items over `calls` calls of `loop(count, work, threads)`; at least
// two threads take part in each call (meet_partner).
template <class Loop>
std::size_t distinct_threads_over_calls(const Loop& loop, unsigned threads, int calls) {
    std::mutex mutex;
    std::set<std::size_t> seen;
    for (int call = 0; call < calls; ++call) {
        std::atomic<int> arrived{0};
        loop(
            8,
            [&](std::size_t item, unsigned) {
                meet_partner(item, arrived);
                const std::lock_guard lock(mutex);
                seen.insert(thread_serial());
            },
            threads);
    }
    return seen.size();
}

// Exit: this object is built before the pool's first use, so it is destroyed after the pool. A
// parallel_for in its destructor must still run every item (on the calling thread) and must not
// touch the stopped pool; Boost.Test has finished by then, so a wrong sum aborts (a failed test).
struct ParallelForAtExit {
    ParallelForAtExit() = default;
    ParallelForAtExit(const ParallelForAtExit&) = delete;
    ParallelForAtExit& operator=(const ParallelForAtExit&) = delete;
    ~ParallelForAtExit() {
        std::atomic<std::size_t> sum{0};
        parallel_for(100, [&](std::size_t item, unsigned) { sum += item; }, 2);
        if (sum.load() != 4950) std::abort();
    }
};
const ParallelForAtExit parallel_for_at_exit;

}  // namespace

// First in the file: the pool's size is then what this test asks for (a pool grown larger by an
// earlier test could hand a call's one seat to a different worker each time).
BOOST_AUTO_TEST_CASE(workers_are_started_once_and_reused) {
    const auto pooled = [](std::size_t count, const auto& work, unsigned threads) { parallel_for(count, work, threads); };
    const auto spawning = [](std::size_t count, const auto& work, unsigned threads) {
        parallel_for_spawning_threads(count, work, threads);
    };
    for (const unsigned threads : {2u, 3u}) {
        const std::size_t used = distinct_threads_over_calls(pooled, threads, 40);
        BOOST_TEST(used >= 2u, "the workers took no part (threads " << threads << ")");
        // The caller plus the workers, however many calls: no thread is started per call. After
        // 2 then 3 were asked for, the pool holds 2 workers (grown once, by one).
        BOOST_TEST(used <= threads, "threads " << threads << ": " << used << " distinct threads ran items");
    }
    // Fault control: threads started per call are new threads, so the same check fails for them.
    const std::size_t spawned = distinct_threads_over_calls(spawning, 2, 40);
    BOOST_TEST(!(spawned <= 2u), spawned << " distinct threads ran items");
    BOOST_TEST(spawned == 41u);
}

BOOST_AUTO_TEST_CASE(the_first_exception_reaches_the_caller_and_stops_the_hand_out) {
    const ThreadsSetting two(2);
    // Item 10 throws (on whichever thread takes it). Items from 100 on take 1 ms each: without
    // the stop they would all run (10 s); with it only those started before the failure was
    // recorded do, a few unless the failing thread is descheduled for most of a second.
    constexpr std::size_t count = 10'000;
    std::atomic<std::size_t> ran{0};
    BOOST_CHECK_EXCEPTION(parallel_for(count,
                                       [&](std::size_t item, unsigned) {
                                           ++ran;
                                           if (item == 10) throw value_error("item 10 failed");
                                           if (item >= 100) std::this_thread::sleep_for(1ms);
                                       }),
                          value_error, [](const value_error& e) { return std::string(e.what()) == "item 10 failed"; });
    BOOST_TEST(ran.load() < 1000u, ran.load() << " of " << count << " items ran: the hand-out went on after the failure");
    // Thrown on a worker (items 0 and 1 are on two threads: meet_partner).
    std::atomic<int> arrived{0};
    BOOST_CHECK_EXCEPTION(parallel_for(2000,
                                       [&](std::size_t item, unsigned thread) {
                                           meet_partner(item, arrived);
                                           if (thread != 0) throw std::range_error("a worker's item failed");
                                       }),
                          std::range_error, [](const std::range_error&) { return true; });
    // The pool is usable after a failure.
    std::atomic<std::size_t> sum{0};
    parallel_for(1000, [&](std::size_t item, unsigned) { sum += item; });
    BOOST_TEST(sum.load() == 1000u * 999u / 2);
}

BOOST_AUTO_TEST_CASE(a_parallel_for_inside_an_item_runs_inline) {
    const ThreadsSetting two(2);
    std::atomic<bool> all_inline{true};
    std::atomic<std::size_t> inner_items{0};
    parallel_for(16, [&](std::size_t, unsigned) {
        if (detail::threads_for(100, 0) != 1) all_inline = false;
        const std::thread::id outer = std::this_thread::get_id();
        parallel_for(100, [&](std::size_t, unsigned thread) {
            ++inner_items;
            if (thread != 0 || std::this_thread::get_id() != outer) all_inline = false;
        });
    });
    BOOST_TEST(all_inline.load());
    BOOST_TEST(inner_items.load() == 1600u);
    BOOST_TEST(detail::threads_for(100, 0) == 2u);  // outside any item again
}

BOOST_AUTO_TEST_CASE(the_threads_setting_and_max_threads_are_obeyed) {
    // The thread indices a call used; `two_or_more`: items 0 and 1 wait for each other.
    const auto threads_in_call = [](std::size_t count, unsigned max_threads, bool two_or_more) {
        std::mutex mutex;
        std::set<std::thread::id> ids;
        std::set<unsigned> indices;
        std::atomic<int> arrived{two_or_more ? 0 : 2};  // 2: nobody waits for a partner
        parallel_for(
            count,
            [&](std::size_t item, unsigned thread) {
                meet_partner(item, arrived);
                std::this_thread::sleep_for(50us);
                const std::lock_guard lock(mutex);
                ids.insert(std::this_thread::get_id());
                indices.insert(thread);
            },
            max_threads);
        BOOST_TEST(ids.size() == indices.size());  // one index per thread
        return indices;
    };
    {
        const ThreadsSetting one(1);
        BOOST_TEST(thread_count() == 1u);
        BOOST_TEST((threads_in_call(50, 0, false) == std::set<unsigned>{0}));
        const std::set<unsigned> overridden = threads_in_call(50, 3, true);  // max_threads overrides the setting
        BOOST_TEST(overridden.size() >= 2u);
        BOOST_TEST(*overridden.rbegin() < 3u);
    }
    {
        const ThreadsSetting four(4);
        BOOST_TEST(thread_count() == 4u);
        const std::set<unsigned> indices = threads_in_call(200, 0, true);
        BOOST_TEST(indices.size() >= 2u);
        BOOST_TEST(*indices.rbegin() < 4u);
        BOOST_TEST((*threads_in_call(3, 0, true).rbegin() < 3u));  // never more threads than items
    }
    BOOST_TEST(thread_count() == std::max(1u, std::thread::hardware_concurrency()));
}

// Independent work on several user threads at once: one call has the pool, the others run
// inline; every item runs exactly once, on one thread.
BOOST_AUTO_TEST_CASE(several_user_threads_may_call_parallel_for_at_once) {
    const ThreadsSetting two(2);
    constexpr std::size_t callers = 4, count = 500;
    std::vector<std::vector<int>> runs(callers, std::vector<int>(count, 0));
    {
        std::vector<std::jthread> users;
        for (std::size_t u = 0; u < callers; ++u) {
            users.emplace_back([&runs, u] {
                for (int call = 0; call < 50; ++call) parallel_for(count, [&](std::size_t item, unsigned) { ++runs[u][item]; });
            });
        }
    }
    for (std::size_t u = 0; u < callers; ++u) {
        BOOST_TEST_CONTEXT("caller " << u) {
            BOOST_TEST(std::all_of(runs[u].begin(), runs[u].end(), [](int n) { return n == 50; }));
        }
    }
}

// The fused op adds dQ terms in key-tile order through fused_detail::add_in_turn; the waits sleep.
BOOST_AUTO_TEST_CASE(turns_are_taken_in_order_and_can_be_called_off) {
    std::atomic<std::size_t> turn{0};
    std::vector<std::size_t> order;
    std::atomic<int> refused{0};
    {
        std::vector<std::jthread> tiles;
        for (std::size_t mine = 3; mine-- > 0;) {  // started last to first
            tiles.emplace_back([&, mine] {
                if (!fused_detail::add_in_turn(turn, mine, [&] { order.push_back(mine); })) ++refused;
            });
            std::this_thread::sleep_for(2ms);
        }
    }
    BOOST_TEST(refused.load() == 0);
    BOOST_TEST((order == std::vector<std::size_t>{0, 1, 2}));
    // A failed item calls the turns off: a waiter gives up, adding nothing, and none waits again.
    std::vector<std::atomic<std::size_t>> turns(2);
    bool added = false, gave_up = false;
    std::jthread waiter([&] { gave_up = !fused_detail::add_in_turn(turns[1], 5, [&] { added = true; }); });
    std::this_thread::sleep_for(2ms);
    fused_detail::stop_turns(turns);
    waiter.join();
    BOOST_TEST(gave_up);
    BOOST_TEST(!added);
    BOOST_TEST(!fused_detail::add_in_turn(turns[0], 0, [&] { added = true; }));
    BOOST_TEST(!added);
}

namespace {

// The spec's attention graph (models/attention.hpp) on a seed's inputs, and the fused op on its
// projections, recorded and differentiated on a tape of its own. At T = 256 the composed graph's
// products stay under kernels::parallel_madds (one thread each, so a product's rounding cannot
// depend on which call had the pool), and the fused op (threaded above 1e6 multiply-adds, results
// independent of the thread count: tests/test_fused_attention.cpp) goes through parallel_for.
struct Gradients {
    std::array<Tensor<double>, 6> tensors;  // O, fused O, dX, dW_Q, dW_K, dW_V
};

Gradients attention_gradients(std::uint64_t seed) {
    constexpr std::size_t T = 256, D = 32, d = 32;
    static_assert(T * T * d < kernels::parallel_madds);
    std::mt19937_64 rng(seed);
    const Tensor<double> x = testing::random_tensor({T, D}, rng), w_q = testing::random_tensor({D, d}, rng),
                         w_k = testing::random_tensor({D, d}, rng), w_v = testing::random_tensor({D, d}, rng);
    Tape<double> tape;
    const Var<double> X = tape.leaf(x), W_Q = tape.leaf(w_q), W_K = tape.leaf(w_k), W_V = tape.leaf(w_v);
    const AttentionResult<double> composed = attention(X, W_Q, W_K, W_V);
    const Var<double> fused = fused_attention(composed.Q, composed.K, composed.V, true, 0);
    tape.backward(testing::probe(composed.O) + testing::probe(fused));
    return {{composed.O.value(), fused.value(), X.grad(), W_Q.grad(), W_K.grad(), W_V.grad()}};
}

}  // namespace

BOOST_AUTO_TEST_CASE(independent_tapes_on_several_threads_match_one_after_the_other) {
    const ThreadsSetting two(2);
    constexpr std::size_t tapes = 4;
    std::vector<Gradients> in_turn, at_once(tapes);
    for (std::size_t t = 0; t < tapes; ++t) in_turn.push_back(attention_gradients(100 + t));
    {
        std::vector<std::jthread> users;
        for (std::size_t t = 0; t < tapes; ++t) users.emplace_back([&at_once, t] { at_once[t] = attention_gradients(100 + t); });
    }
    for (std::size_t t = 0; t < tapes; ++t) {
        for (std::size_t x = 0; x < 6; ++x) {
            BOOST_TEST((at_once[t].tensors[x] == in_turn[t].tensors[x]), "tape " << t << ", result " << x);
        }
    }
    // Fault control: the comparison tells two seeds' graphs apart.
    BOOST_TEST(!(at_once[0].tensors[2] == in_turn[1].tensors[2]));
}

namespace {

// One parallel_chunks loop of `count` items on `threads` threads: every index visited exactly once,
// by chunks inside [0, count), in as many chunks as autodiff/parallel.hpp says (one per thread, each
// of at least `grain` items; the whole loop at once below two grains' worth, or when grain is 0).
void visits_each_index_once(std::size_t count, std::size_t grain, unsigned threads) {
    std::vector<std::atomic<int>> visits(count);
    std::atomic<std::size_t> chunks{0};
    std::atomic<bool> inside{true};
    parallel_chunks(count, grain, [&](std::size_t first, std::size_t last) {
        ++chunks;
        if (first > last || last > count) {
            inside = false;
            return;
        }
        for (std::size_t k = first; k < last; ++k) visits[k].fetch_add(1, std::memory_order_relaxed);
    });
    std::size_t wrong = 0, first_wrong = 0;
    for (std::size_t k = 0; k < count; ++k)
        if (visits[k].load() != 1 && wrong++ == 0) first_wrong = k;
    BOOST_TEST(inside.load(), "a chunk reaches outside [0, count)");
    BOOST_TEST(wrong == 0u, wrong << " of " << count << " indices not visited exactly once, the first " << first_wrong
                                  << " (" << (wrong == 0 ? 1 : visits[first_wrong].load()) << " times)");
    const std::size_t expected = grain == 0 || count < 2 * grain ? 1 : std::min<std::size_t>(count / grain, threads);
    BOOST_TEST(chunks.load() == expected);
}

}  // namespace

// Counts odd and prime (and 2), grains from 1 item to elementwise_grain (and 0: never split), 2 to
// 4 threads: the chunk boundaries chunk·count/chunks leave no index out and none twice, the last
// included.
BOOST_AUTO_TEST_CASE(parallel_chunks_visits_every_index_once_at_odd_and_prime_counts) {
    constexpr std::array<std::size_t, 11> counts{1, 2, 3, 5, 7, 31, 97, 1009, 4099, 65537, 262147};
    constexpr std::array<std::size_t, 7> grains{0, 1, 2, 3, 7, 1000, elementwise_grain};
    for (unsigned threads = 2; threads <= testing::most_threads_tested; ++threads) {
        const ThreadsSetting setting(threads);
        for (const std::size_t count : counts)
            for (const std::size_t grain : grains) {
                BOOST_TEST_CONTEXT("count " << count << ", grain " << grain << ", " << threads << " threads") {
                    visits_each_index_once(count, grain, threads);
                }
            }
    }
}

namespace {

template <class T>
constexpr T nan_of = std::numeric_limits<T>::quiet_NaN();

// An op's forward and its VJP for input 0 with the threads setting at `threads`, called on the op
// struct into outputs filled with NaN, so an element a loop skips stays NaN. (Not through a tape: a
// tape takes over the buffers a dying tape left, which may hold the right values where a loop
// skipped an element.)
template <class Op, class T, class Settings>
std::pair<Tensor<T>, Tensor<T>> forward_and_vjp(unsigned threads, const Settings& s,
                                                const std::vector<const Tensor<T>*>& in, const Tensor<T>& G) {
    const ThreadsSetting setting(threads);
    const Inputs<T> inputs(in);
    Tensor<T> out(G.shape(), nan_of<T>), saved, din(in[0]->shape(), nan_of<T>);
    Op::template forward<T>(s, inputs, out, saved);
    Op::template vjp<T>(s, VjpArgs<T>{inputs, out, saved, G}, 0, din);
    return {std::move(out), std::move(din)};
}

// Where two results differ (a NaN differs from everything): empty, or how many and the first.
template <class T>
std::string differing(const Tensor<T>& a, const Tensor<T>& b) {
    std::size_t count = 0, first = 0;
    for (std::size_t x = 0; x < a.size(); ++x)
        if (!(a[x] == b[x]) && count++ == 0) first = x;
    if (count == 0) return {};
    return fmt::format("{} of {} differ, the first at {}", count, a.size(), index_string(a.shape(), first));
}

// `Op` on inputs `in` with upstream gradient G at 1 to 16 threads: values and gradients one
// thread's bit for bit, and the last row of each result true to the op's formula
// (`last_row_off(out, din)` counts the values and gradients there that miss it).
template <class Op, class T, class Settings, class LastRowOff>
void matches_one_thread_and_formula(const std::string& what, const Settings& s, const std::vector<const Tensor<T>*>& in,
                                    const Tensor<T>& G, const LastRowOff& last_row_off) {
    const auto one = forward_and_vjp<Op>(1, s, in, G);
    for (unsigned threads = 1; threads <= testing::most_threads_tested; ++threads) {
        const auto result = threads == 1 ? one : forward_and_vjp<Op>(threads, s, in, G);
        BOOST_TEST_CONTEXT(what << ", " << threads << " threads") {
            const std::string values = differing(result.first, one.first);
            const std::string gradients = differing(result.second, one.second);
            BOOST_TEST(values.empty(), "values: " << values);
            BOOST_TEST(gradients.empty(), "gradients: " << gradients);
            const std::size_t off = last_row_off(result.first, result.second);
            BOOST_TEST(off == 0u,
                       off << " of the last row's " << 2 * G.cols() << " values and gradients off the formula");
        }
    }
}

// Softmax's last row against its formula in long double, with the bounds of
// tests/test_kernel_remainders.cpp (an exp within 4u, plus |S_j − max|·u ≤ 2u from rounding the
// shift of scores in [-1, 1]; sums of n terms within n·u): A_j within (n + 8)·u of
// e^(S_j − max)/Σ_k e^(S_k − max), relative; dS_j within (n + 8)·u·A_j·(|G_j| + Σ_k |G_k|·A_k) of
// A_j·(G_j − Σ_k G_k·A_k), from A as returned.
template <class T>
std::size_t softmax_last_row_off(const Tensor<T>& S, const Tensor<T>& G, const Tensor<T>& A, const Tensor<T>& dS) {
    using Long = long double;
    const std::size_t n = S.cols(), row = S.size() - n;
    const Long bound = Long(n + 8) * std::numeric_limits<T>::epsilon() / 2;
    Long row_max = S[row], total = 0, mean = 0, magnitude = 0;
    for (std::size_t j = 0; j < n; ++j) row_max = std::max(row_max, Long(S[row + j]));
    for (std::size_t j = 0; j < n; ++j) {
        total += std::exp(Long(S[row + j]) - row_max);
        mean += Long(G[row + j]) * Long(A[row + j]);
        magnitude += std::abs(Long(G[row + j])) * Long(A[row + j]);
    }
    std::size_t off = 0;
    for (std::size_t j = 0; j < n; ++j) {
        const Long a = A[row + j], g = G[row + j], weight = std::exp(Long(S[row + j]) - row_max) / total;
        off += !(std::abs(a - weight) <= bound * weight);
        off += !(std::abs(Long(dS[row + j]) - a * (g - mean)) <= bound * a * (std::abs(g) + magnitude));
    }
    return off;
}

template <class T>
Tensor<T> drawn(const Shape& shape, std::mt19937_64& rng) {
    return tensor_cast<T>(testing::random_tensor(shape, rng));
}

// Softmax's rows in chunks of at least Softmax::row_grain(n) rows: 2113 rows of 31 (grain 528),
// 521 rows of 127 (grain 129), four grains' worth or more, so 2 to 4 threads each take a chunk.
template <class T>
void chunked_softmax(const char* type, std::mt19937_64& rng) {
    for (const Shape& shape : {Shape{2113, 31}, Shape{521, 127}}) {
        const Tensor<T> S = drawn<T>(shape, rng), G = drawn<T>(shape, rng);
        BOOST_TEST(shape.size() / shape.cols() >= 4 * Softmax::row_grain(shape.cols()));
        matches_one_thread_and_formula<Softmax>(
            fmt::format("{} softmax {}", type, shape.to_string()), NoSettings{}, {&S}, G,
            [&](const Tensor<T>& A, const Tensor<T>& dS) { return softmax_last_row_off(S, G, A, dS); });
    }
}

// Scale and mask, elementwise in chunks of at least elementwise_grain (65 536) elements: 521·509
// and 3·263·337 elements, odd, four grains' worth and more. Each is exact (one product, or a
// copy), so its last row must equal its formula computed here; the mask is one 263×337 matrix
// over a batch of 3, so its walk restarts inside a chunk.
template <class T>
void chunked_scale_and_mask(const char* type, std::mt19937_64& rng) {
    const Shape wide{521, 509}, batch{3, 263, 337};
    BOOST_TEST(wide.size() >= 4 * elementwise_grain);
    BOOST_TEST(batch.size() >= 4 * elementwise_grain);
    const Tensor<T> X = drawn<T>(wide, rng), G = drawn<T>(wide, rng);
    const Tensor<T> S = drawn<T>(batch, rng), H = drawn<T>(batch, rng);
    Tensor<T> M(Shape{263, 337});
    std::bernoulli_distribution visible(0.7);
    for (T& x : M.data()) x = visible(rng) ? T(1) : T(0);
    const T c = T(0.3), hidden = -std::numeric_limits<T>::infinity();
    const auto scale_off = [&](const Tensor<T>& Y, const Tensor<T>& dX) {
        std::size_t off = 0;
        for (std::size_t k = X.size() - X.cols(); k < X.size(); ++k)
            off += !(Y[k] == T(c * X[k])) + !(dX[k] == T(c * G[k]));
        return off;
    };
    const auto mask_off = [&](const Tensor<T>& Y, const Tensor<T>& dS) {
        std::size_t off = 0;
        for (std::size_t k = S.size() - S.cols(), j = M.size() - M.cols(); k < S.size(); ++k, ++j) {
            const bool shown = M[j] != T(0);
            off += !(Y[k] == (shown ? S[k] : hidden)) + !(dS[k] == (shown ? H[k] : T(0)));
        }
        return off;
    };
    matches_one_thread_and_formula<Scale>(fmt::format("{} scale", type), Scale::Settings<T>{c}, {&X}, G, scale_off);
    matches_one_thread_and_formula<Mask>(fmt::format("{} mask", type), NoSettings{}, {&S, &M}, H, mask_off);
}

}  // namespace

// The ops whose loops go through parallel_chunks, at odd and prime sizes that are split over 2 to
// 4 threads: the single thread's result bit for bit, the last row included and true to the formula.
BOOST_AUTO_TEST_CASE(chunked_ops_at_odd_sizes_match_one_thread_and_their_formula) {
    std::mt19937_64 rng(29);
    chunked_softmax<double>("double", rng);
    chunked_softmax<float>("float", rng);
    chunked_scale_and_mask<double>("double", rng);
    chunked_scale_and_mask<float>("float", rng);
}

namespace {

// The tape's NaN scan (Tape::check_no_nan) over n elements, chunked over the threads from
// 2·elementwise_grain numbers on: a NaN only in element k (the last unless given) of a leaf, of an
// op's output, of an op's VJP contribution and of backward's upstream gradient is refused with
// value_error, named with its index (docs/design.md, "No NaN leaks out").
template <class T>
void nan_in_one_element_is_refused(std::size_t n, unsigned threads, std::optional<std::size_t> element = {}) {
    const ThreadsSetting setting(threads);
    const std::size_t k = element.value_or(n - 1);
    const Tensor<T> ones(Shape{n}, T(1));
    Tensor<T> with_nan = ones, with_inf = ones, with_zero = ones;
    with_nan[k] = nan_of<T>;
    with_inf[k] = std::numeric_limits<T>::infinity();
    with_zero[k] = T(0);
    const auto refusal = [](const auto& record) {
        return testing::message_of<value_error>([&] {
            Tape<T> tape;
            record(tape);
        });
    };
    const std::string at = " at index " + index_string(Shape{n}, k);
    const std::array<std::pair<std::string, std::string>, 4> cases{{
        {refusal([&](Tape<T>& tape) { tape.leaf(with_nan, "x"); }), "leaf: NaN in x" + at},
        {refusal([&](Tape<T>& tape) { mul(tape.leaf(with_inf), tape.leaf(with_zero)); }),  // ∞·0
         "mul: NaN in its output" + at},
        {refusal([&](Tape<T>& tape) { tape.backward(mul(tape.leaf(with_inf), tape.leaf(ones)), with_zero); }),
         "mul: NaN in the gradient of its input 1" + at},  // dY = G·X = 0·∞
        {refusal([&](Tape<T>& tape) { tape.backward(scale(tape.leaf(ones), T(2)), with_nan); }),
         "backward: NaN in the upstream gradient" + at},
    }};
    for (const auto& [message, expected] : cases) {
        BOOST_TEST(message.find(expected) != std::string::npos,
                   "n=" << n << ", element " << k << ", " << threads << " threads: " << message);
    }
}

}  // namespace

// A float or double tensor of up to 16 elements (a scalar node) is scanned at the call, in the
// header; a larger one, or any other type, by the compiled scan (Tape::check_no_nan). Every size on
// both sides of that boundary, with the NaN in its first, middle or last element, is refused and
// named the same way.
BOOST_AUTO_TEST_CASE(the_nan_scan_finds_a_nan_in_any_element_of_small_tensors) {
    for (std::size_t n = 1; n <= 40; ++n)
        for (const std::size_t k : {std::size_t{0}, n / 2, n - 1}) {
            nan_in_one_element_is_refused<double>(n, 1, k);
            nan_in_one_element_is_refused<float>(n, 1, k);
        }
}

// Sizes prime and past two grains (131 101: two chunks; 196 613: three; 262 147: four), on 1 to 16
// threads (fewer chunks than threads from 3 on): the chunk holding the last element is scanned to its end.
BOOST_AUTO_TEST_CASE(the_nan_scan_finds_a_nan_in_the_last_element_at_odd_sizes) {
    static_assert(std::size_t{131101} >= 2 * elementwise_grain);
    for (const std::size_t n : {std::size_t{131101}, std::size_t{196613}, std::size_t{262147}})
        for (unsigned threads = 1; threads <= testing::most_threads_tested; ++threads) {
            nan_in_one_element_is_refused<double>(n, threads);
            nan_in_one_element_is_refused<float>(n, threads);
        }
}
