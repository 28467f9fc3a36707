// The consumer project's program: what a user's program does with tapegrad, through the installed
// (or added) headers, linked statically or to the shared library (the consumer tests build it both
// ways and run it; CTest also runs an in-tree copy linked to libtapegrad.so, under the sanitizers
// in the sanitizer build). It records attention, runs backward, prints tensors with the fmt
// formatter, runs the full and the fast gradient checks and a JVP and an HVP check, runs the
// library's threads (set_threads(2)), and makes and destroys tapes on threads of its own: some
// joined, one still running when main returns. Each of those touches the thread-local objects of
// header code (the tape's node pool, the products' and replays' scratch) that the program and the
// shared library both instantiate: the exit must be clean (an object shared by both but guarded
// twice was built twice and freed twice by glibc's thread-local destructors at exit).
// It checks its own results and exits non-zero when one is wrong, so the tests around it can fail.
// A tapegrad error (TAPEGRAD_CPU=bogus makes the library throw one) is caught as its own type and
// exits 2: the consumer tests use it to show that exceptions cross the shared library intact.
#include <tapegrad.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using namespace tapegrad;

const Tensor<double> X_values = Tensor<double>::matrix({{0.5, -1.0}, {0.25, 2.0}, {1.5, 0.0}});
const Tensor<double> W_values = Tensor<double>::matrix({{1.0, 0.5}, {-0.5, 1.0}});

// Attention with one weight for Q, K and V (three branches into W, three into X), recorded on a
// fresh tape of this thread; returns the sum of dX's entries, or NaN when the gradient is absent.
double attention_gradient_sum() {
    Tape<double> tape;
    const Var<double> X = tape.leaf(X_values, "X");
    const Var<double> W = tape.leaf(W_values, "W");
    tape.backward(sum(attention(X, W, W, W).O));
    double total = 0;
    for (const double g : X.grad().data()) total += g;
    return X.grad().shape() == Shape{3, 2} ? total : std::nan("");
}

bool checks_pass() {
    const auto graph = [](auto in) { return sum(attention(in[0], in[1], in[1], in[1]).O); };
    const NamedTensor leaves[] = {{"X", X_values}, {"W", W_values}};
    const CheckReport full = check_gradients(graph, leaves);
    CheckOptions fast_options;
    fast_options.mode = CheckOptions::Mode::fast;
    const CheckReport fast = check_gradients(graph, leaves, fast_options);
    const auto squares = [](auto in) {
        const auto O = attention(in[0], in[1], in[1], in[1]).O;
        return sum(O * O);
    };
    const SecondOrderReport jvp = check_jvp(squares, leaves);
    const SecondOrderReport hvp = check_hvp(squares, leaves);
    fmt::print("{}\n{}\n{}\n{}\n", full.summary(), fast.summary(), jvp.summary(), hvp.summary());
    return full.passed && fast.passed && jvp.passed && hvp.passed;
}

// Threads of the program's own: two make and destroy tapes and are joined; one makes a tape,
// keeps it, and is still asleep when main returns (its thread-local objects are never destroyed;
// the main thread's and the joined threads' are).
bool own_threads_agree(double expected) {
    std::vector<double> sums(2);
    std::vector<std::thread> joined;
    for (std::size_t t = 0; t < sums.size(); ++t) {
        joined.emplace_back([&sums, t] {
            for (int round = 0; round < 3; ++round) sums[t] = attention_gradient_sum();
        });
    }
    for (std::thread& thread : joined) thread.join();

    std::mutex mutex;
    std::condition_variable recorded;
    double left_running_sum = std::nan("");
    bool done = false;
    std::thread([&] {
        Tape<double> kept;  // alive until the process ends
        const Var<double> X = kept.leaf(X_values, "X");
        kept.backward(sum(X * X));
        const double result = attention_gradient_sum();
        {
            const std::lock_guard lock(mutex);
            left_running_sum = result;
            done = true;
        }
        recorded.notify_one();
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }).detach();
    std::unique_lock lock(mutex);
    recorded.wait(lock, [&] { return done; });
    return sums[0] == expected && sums[1] == expected && left_running_sum == expected;
}

int run() {
    Tape<double> tape;
    const Var<double> X = tape.leaf(X_values, "X");
    const Var<double> W = tape.leaf(W_values, "W");
    const AttentionResult<double> att = attention(X, W, W, W);
    const Var<double> J = sum(att.O);
    tape.backward(J);
    fmt::print("tapegrad consumer: cpu={} J = {:.12}, dX = {:.6}\n", cpu_level_name(cpu_level()), J.value(), X.grad());
    for (const double g : X.grad().data()) {
        if (!is_finite(g)) return EXIT_FAILURE;
    }
    if (X.grad().shape() != Shape{3, 2}) return EXIT_FAILURE;

    set_threads(2);  // the library's pool: its worker threads have thread-local objects too
    const double expected = attention_gradient_sum();
    if (!checks_pass()) {
        fmt::print(stderr, "tapegrad consumer: a gradient check failed\n");
        return EXIT_FAILURE;
    }
    if (!own_threads_agree(expected)) {
        fmt::print(stderr, "tapegrad consumer: a tape on another thread gave another gradient\n");
        return EXIT_FAILURE;
    }
    fmt::print("tapegrad consumer: checks passed, threads agree\n");
    return EXIT_SUCCESS;
}

}  // namespace

int main() {
    try {
        return run();
    } catch (const tapegrad::value_error& e) {
        fmt::print(stderr, "tapegrad consumer: caught tapegrad::value_error: {}\n", e.what());
        return 2;
    }
}
