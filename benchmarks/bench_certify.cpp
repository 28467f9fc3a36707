// bench_certify: certified gradients (check/certify.hpp, 50-digit intervals) against the 50-digit
// finite-difference check (check/gradcheck.hpp) of the same graph, one thread each side:
//   seed       the walkthrough's graph (examples/seed_walkthrough.cpp): the spec's attention with X
//              feeding Q, K and V (X, W_Q, W_K, W_V 2×2, J = Σ O∘G), both in the generic-lambda
//              form, timed side by side in alternating batches (median and best, ms per call);
//   multihead  a causal two-head layer with its output projection (tapegrad-check's multihead
//              model, J = Σ Y∘Y) at the T and D of each line, both on the tape ordinary code
//              recorded in double (certify_gradients(tape, J) against check_gradients(tape, J)),
//              alternately, the best of a few runs (one at D = 32; seconds of the thread's CPU).
// `ratio` is certification over check (both with X's branches: the check attributes them too).
// Every line also says what was proven: elements certified of all, branch elements (X feeding Q,
// K and V) certified of all, and the widest bound relative to max(1, |derivative|).
#include "host.hpp"
#include "models/retrieval.hpp"
#include "tapegrad.hpp"
#include "timing.hpp"
#include "tools/options.hpp"

#include "check/certify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

using namespace tapegrad;

namespace {

// The widest certified bound relative to max(1, |derivative|), as the walkthrough prints it.
double relative_bound(const CertificationReport& report) {
    double widest = 0;
    for (const auto* elements : {&report.derivatives, &report.branches}) {
        for (const CertifiedDerivative& d : *elements)
            widest = std::max(widest, d.bound / std::max(1.0, std::abs(to_double(d.derivative))));
    }
    return widest;
}

void bench_seed() {
    const double a = std::sqrt(2.0) * std::log(3.0);
    const Tensor<double> G = Tensor<double>::matrix({{1, 0}, {0, 2}});
    const NamedTensor leaves[] = {{"X", Tensor<double>::matrix({{1, 0}, {0, 1}})},
                                  {"W_Q", Tensor<double>::matrix({{a, 0}, {0, a}})},
                                  {"W_K", Tensor<double>::matrix({{1, 0}, {0, 1}})},
                                  {"W_V", Tensor<double>::matrix({{2, 0}, {0, 4}})}};
    const auto graph = [&G](auto in) {
        using T = typename decltype(in)::value_type::scalar_type;
        const auto O = attention(in[0], in[1], in[2], in[3]).O;
        return sum(O * O.tape().constant(tensor_cast<T>(G), "G"));
    };
    CertificationReport certified;
    CheckReport checked;
    const std::vector<timing::Timing> t = timing::alternate_timings(
        {[&] { certified = certify_gradients(graph, leaves); }, [&] { checked = check_gradients(graph, leaves); }}, 11,
        0.2);
    fmt::print(
        "seed elements=16 certified={} of {} branches={} of {} relative_bound={:.2g} check_passed={} "
        "certify_ms={:.3f},{:.3f} check_ms={:.3f},{:.3f} ratio={:.2f} (median,best)\n",
        certified.certified, certified.derivatives.size(), certified.branches_certified, certified.branches.size(),
        relative_bound(certified), checked.passed, t[0].median_us / 1e3, t[0].best_us / 1e3, t[1].median_us / 1e3,
        t[1].best_us / 1e3, t[0].median_us / t[1].median_us);
}

// tapegrad-check's multihead model: X uniform in [−1, 1), weights in ±sqrt(3/D), seed 20261129.
void bench_multihead(std::size_t T, std::size_t D, std::size_t heads, int rounds) {
    std::mt19937_64 generator(20261129);
    const double a = std::sqrt(3.0 / static_cast<double>(D));
    const auto uniform = [&generator](std::size_t rows, std::size_t columns, double bound) {
        Tensor<double> t(Shape{rows, columns});
        for (double& x : t.data()) x = draw_uniform(generator, bound);
        return t;
    };
    Tape<double> tape;
    const Var<double> X = tape.leaf(uniform(T, D, 1.0), "X");
    MultiHeadWeights<double> W{tape.leaf(uniform(D, D, a), "W_Q"), tape.leaf(uniform(D, D, a), "W_K"),
                               tape.leaf(uniform(D, D, a), "W_V"), tape.leaf(uniform(D, D, a), "W_O")};
    MultiHeadOptions options;
    options.heads = heads;
    const Var<double> Y = multihead_attention(X, W, options).Y;
    const Var<double> J = sum(Y * Y);
    CertificationReport certified;
    CheckReport checked;
    std::vector<double> certify_seconds, check_seconds;
    for (int round = 0; round < rounds; ++round) {
        double start = timing::thread_seconds();
        checked = check_gradients(tape, J);
        check_seconds.push_back(timing::thread_seconds() - start);
        start = timing::thread_seconds();
        certified = certify_gradients(tape, J);
        certify_seconds.push_back(timing::thread_seconds() - start);
    }
    const double certify_best = *std::min_element(certify_seconds.begin(), certify_seconds.end());
    const double check_best = *std::min_element(check_seconds.begin(), check_seconds.end());
    fmt::print(
        "multihead causal T={} D={} H={} elements={} certified={} of {} branches={} of {} relative_bound={:.2g} "
        "check_passed={} certify_s={:.3f} check_s={:.3f} ratio={:.2f} (best of {})\n",
        T, D, heads, certified.derivatives.size(), certified.certified, certified.derivatives.size(),
        certified.branches_certified, certified.branches.size(), relative_bound(certified), checked.passed,
        certify_best, check_best, certify_best / check_best, rounds);
}

}  // namespace

int main(int argc, char** argv) {
    // No options: its sizes are fixed (the issue's: the walkthrough's graph, and D = 32, T = 16).
    if (argc > 1) {
        fmt::print(stderr, "bench_certify: takes no arguments, got '{}' (usage: bench_certify)\n", argv[1]);
        return cli::exit_usage;
    }
    timing::keep_freed_memory();
    set_threads(1);
    timing::print_host_line();
    bench_seed();
    bench_multihead(8, 16, 2, 3);
    bench_multihead(16, 32, 2, 1);  // minutes a side: one run each
    return 0;
}
