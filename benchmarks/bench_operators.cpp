// bench_operators: what the operators on Var<T> (ops/operators.hpp) cost against the named calls
// they stand for, on an elementwise expression over n-element tensors a, b, c:
//   operators: y = (a*b + c) / (a + 2.0) - b
//   named:     y = sub(div(add(mul(a, b), c), shift(a, 2.0)), b)
// Both record the same six ops, so the ratio should be 1 up to noise: the operators are thin
// inline wrappers. Each side runs forward + backward (seeded with a fixed random G = dJ/dy) on its
// own tape, reused across runs (cleared between them), in double, on one thread, in alternating
// batches so that both see the same machine state; times are CPU time of the thread (the machine
// is shared), per graph. Prints, per n:
//   operators n=… named_best_us=… named_median_us=… operators_best_us=… operators_median_us=…
//   operators n=… named_us=… operators_us=… ratio=…        (medians; ratio = operators / named)
//
// Usage: bench_operators [n ...]    (default: n = 64 4096)
#include "tapegrad.hpp"
#include "host.hpp"
#include "timing.hpp"
#include "ops/operators.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using namespace tapegrad;

namespace {

using timing::median;
using timing::thread_seconds;

Tensor<double> uniform_tensor(std::size_t n, std::mt19937_64& rng) {
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);  // a + 2.0 stays in (1, 3): no zero divisor
    Tensor<double> t(Shape{n});
    for (double& x : t.data()) x = uniform(rng);
    return t;
}

struct Inputs3 {
    Tensor<double> a, b, c, G;
};

// One forward + backward of the expression on `tape`, spelled with operators or with named calls;
// returns a, b, c and y.
template <bool with_operators>
std::array<Var<double>, 4> run(Tape<double>& tape, const Inputs3& in) {
    tape.clear();
    const Var<double> a = tape.leaf(in.a, "a"), b = tape.leaf(in.b, "b"), c = tape.leaf(in.c, "c");
    Var<double> y;
    if constexpr (with_operators) {
        y = (a * b + c) / (a + 2.0) - b;
    } else {
        y = sub(div(add(mul(a, b), c), shift(a, 2.0)), b);
    }
    tape.backward(y, in.G);
    return {a, b, c, y};
}

// Graphs per timed batch so that a batch lasts about `target` seconds.
template <bool with_operators>
std::size_t batch_size(Tape<double>& tape, const Inputs3& in, double target) {
    std::size_t iterations = 1;
    for (;;) {
        const double start = thread_seconds();
        for (std::size_t i = 0; i < iterations; ++i) run<with_operators>(tape, in);
        const double elapsed = thread_seconds() - start;
        if (elapsed >= target / 4) {
            const double scaled = static_cast<double>(iterations) * target / elapsed;
            return std::max<std::size_t>(1, static_cast<std::size_t>(scaled));
        }
        iterations *= 4;
    }
}

// The two spellings must record the same ops (in the order the compiler evaluates operands, which
// C++ leaves open, so compared as sorted lists) and compute the same values and gradients, bit for bit.
bool same_results(const Inputs3& in) {
    Tape<double> written, named;
    const auto x = run<true>(written, in);
    const auto y = run<false>(named, in);
    const auto ops = [](const Tape<double>& tape) {
        std::vector<std::string_view> names;
        for (std::size_t i = 0; i < tape.size(); ++i) names.push_back(tape.info(i).op);
        std::sort(names.begin(), names.end());
        return names;
    };
    return ops(written) == ops(named) && x[3].value() == y[3].value() && x[0].grad() == y[0].grad() &&
           x[1].grad() == y[1].grad() && x[2].grad() == y[2].grad();
}

void bench(std::size_t n) {
    std::mt19937_64 rng(n);
    const Inputs3 in{uniform_tensor(n, rng), uniform_tensor(n, rng), uniform_tensor(n, rng), uniform_tensor(n, rng)};
    if (!same_results(in)) {
        fmt::print(stderr, "bench_operators: the two spellings differ (ops, values or gradients)\n");
        std::exit(1);
    }
    Tape<double> written, named;
    run<true>(written, in);  // warm-up: the tapes' buffers are allocated once
    run<false>(named, in);
    const double target = 0.01;  // seconds per batch
    const std::size_t iterations =
        std::max(batch_size<true>(written, in, target), batch_size<false>(named, in, target));
    std::vector<double> named_us, operators_us;
    const auto time_batch = [&](bool with_operators) {
        const double start = thread_seconds();
        for (std::size_t i = 0; i < iterations; ++i) {
            if (with_operators) {
                run<true>(written, in);
            } else {
                run<false>(named, in);
            }
        }
        const double us = (thread_seconds() - start) * 1e6 / static_cast<double>(iterations);
        (with_operators ? operators_us : named_us).push_back(us);
    };
    for (int round = 0; round < 101; ++round) {  // which side goes first alternates too
        time_batch(round % 2 == 0);
        time_batch(round % 2 != 0);
    }
    fmt::print("operators n={} named_best_us={:.3f} named_median_us={:.3f} operators_best_us={:.3f} "
               "operators_median_us={:.3f}\n",
               n, *std::min_element(named_us.begin(), named_us.end()), median(named_us),
               *std::min_element(operators_us.begin(), operators_us.end()), median(operators_us));
    fmt::print("operators n={} named_us={:.3f} operators_us={:.3f} ratio={:.3f}\n", n, median(named_us),
               median(operators_us), median(operators_us) / median(named_us));
}

}  // namespace

int main(int argc, char** argv) {
    tapegrad::timing::keep_freed_memory();  // before any contender allocates (timing.hpp says why)
    set_threads(1);
    std::vector<std::size_t> sizes;
    try {  // read the way every program of the project reads its numbers (tools/options.hpp)
        for (int i = 1; i < argc; ++i) sizes.push_back(cli::integer_argument("n", argv[i], std::size_t{1}, std::size_t{1} << 26));
    } catch (const cli::usage_error& e) {
        fmt::print(stderr, "bench_operators: {} (usage: bench_operators [n]...)\n", e.what());
        return cli::exit_usage;
    }
    if (sizes.empty()) sizes = {64, 4096};
    timing::print_host_line();
    for (const std::size_t n : sizes) bench(n);
    return 0;
}
