// Benchmark of the fused attention op (ops/fused_attention.hpp) against tapegrad's composed graph
// and LibTorch's composed graph, on the spec's single-head attention with projections:
//   Q = X·W_Q, K = X·W_K, V = X·W_V (X [T×D], D = d = r), O = attention, backward seeded with a
//   random G = dJ/dO; timed forward + backward, in double, best of a few runs. Each graph runs on
//   one Tape reused across its runs (cleared between them) after an untimed warm-up run.
// Prints one line per (T, threads):
//   fused T=… d=… threads=… cpu=… fused_us=… fused_median_us=… fused_gflops=… composed_us=… libtorch_us=… peak_mib=…
// (cpu= the kernels' level, autodiff/cpu.hpp; TAPEGRAD_CPU forces one. GFLOP/s counts the fused
// op's 7 products of T²·d, 2 flops per multiply-add, on the best wall time.) Then, for the same
// (T, threads), the step on a float tape with float32 tile products against bfloat16 ones (the
// bfloat16 policy: fused_attention_bf16), alternated:
//   fused_float T=… d=… threads=… cpu=… rounds=… float32_us=… … bfloat16_over_float32_best=… …_median=…
// peak_mib is the heap the fused run needs beyond its inputs (X, W, Q, K, V), its output O and the
// gradients (dO seed, dQ, dK, dV, dX, dW): the peak of live heap bytes during forward + backward,
// minus the live bytes before it, minus those tensors' bytes. Live bytes are counted by wrapping
// malloc/free (and the aligned and realloc variants) in this program, so std::vector, Eigen's
// GEMM blocks and everything else are included; thread stacks (mmap by pthreads) are not.
// The composed graphs are skipped for T > 4096 (each T×T matrix is then 2 GiB or more: "na").
//
// Usage: bench_fused [--threads N] [--fused-only] [T ...]
//   (default: T = 1024 4096 16384, threads 1 then 2; --fused-only skips the composed graphs)

#include "tapegrad.hpp"
#include "host.hpp"
#include "live_heap.hpp"
#include "ops/fused_attention.hpp"
#include "tools/options.hpp"

#ifdef TAPEGRAD_HAVE_TORCH
#include <torch/torch.h>
#endif

#include <fmt/format.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace tapegrad;
using Clock = std::chrono::steady_clock;

struct BenchInputs {
    Tensor<double> X, W_Q, W_K, W_V, G;
};

BenchInputs make_inputs(std::size_t T, std::size_t d) {
    std::mt19937_64 rng(T * 131 + d);
    std::normal_distribution<double> normal;
    const auto random = [&](const Shape& shape, double scale) {
        Tensor<double> t(shape);
        for (double& x : t.data()) x = scale * normal(rng);
        return t;
    };
    // Unit-variance X and weights of variance 1/D: unit-variance Q, K, V, so Q·Kᵀ/√d has unit
    // variance (the spec's scaling model) and softmax is neither uniform nor saturated.
    const double w = 1 / std::sqrt(double(d));
    return {random({T, d}, 1.0), random({d, d}, w), random({d, d}, w), random({d, d}, w), random({T, d}, 1.0)};
}

// CPU time of the whole process (all threads), in microseconds.
double cpu_us() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) * 1e6 + double(t.tv_nsec) / 1e3;
}

// Best wall time, best CPU time and median wall time of `runs` calls, in microseconds. On a
// shared machine the wall time includes waiting for a core; with one thread the CPU time is the
// work itself.
struct Timing {
    double wall_us = 1e300, cpu_us = 1e300, median_wall_us = 0;
};
Timing best_of(int runs, const std::function<void()>& run) {
    Timing best;
    std::vector<double> walls;
    for (int k = 0; k < runs; ++k) {
        const auto start = Clock::now();
        const double cpu_start = cpu_us();
        run();
        best.cpu_us = std::min(best.cpu_us, cpu_us() - cpu_start);
        walls.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
        best.wall_us = std::min(best.wall_us, walls.back());
    }
    std::sort(walls.begin(), walls.end());
    best.median_wall_us = walls[walls.size() / 2];
    return best;
}

// One fused forward + backward on `tape` (cleared first; the timed runs reuse one tape, as the
// composed runs do, so neither pays for a fresh tape's page faults). With `measure`, returns the
// extra heap bytes (see the top of this file); that needs a tape that has held nothing yet.
double fused_run(Tape<double>& tape, const BenchInputs& in, bool measure) {
    tape.clear();
    const long long before = heap::live.load();
    heap::peak = before;
    long long accounted = 0;
    {
        const Var<double> X = tape.leaf(in.X), W_Q = tape.leaf(in.W_Q), W_K = tape.leaf(in.W_K),
                          W_V = tape.leaf(in.W_V);
        const Var<double> O = fused_attention(matmul(X, W_Q), matmul(X, W_K), matmul(X, W_V), false, 0);
        tape.backward(O, in.G);
        if (measure) {
            // Inputs (leaves and Q, K, V), the output O, and every gradient on the tape.
            long long bytes = 0;
            for (std::size_t i = 0; i < tape.size(); ++i) {
                // info.bytes = value + saved + gradient; the fused node's saved L (one number per
                // query row) is memory the op adds, so it is not subtracted.
                const NodeInfo info = tape.info(i);
                bytes += static_cast<long long>(info.bytes);
                if (info.op == FusedAttention::name) bytes -= static_cast<long long>(in.X.rows() * sizeof(double));
            }
            accounted = bytes;
        }
    }
    if (!measure) return 0;
    return double(heap::peak.load() - before - accounted);
}

// The same inputs rounded once to float, for the float tape's two arithmetics.
struct FloatInputs {
    Tensor<float> X, W_Q, W_K, W_V, G;
    explicit FloatInputs(const BenchInputs& in)
        : X(tensor_cast<float>(in.X)),
          W_Q(tensor_cast<float>(in.W_Q)),
          W_K(tensor_cast<float>(in.W_K)),
          W_V(tensor_cast<float>(in.W_V)),
          G(tensor_cast<float>(in.G)) {}
};

// One fused forward + backward on a float tape, cleared first: its tile products in float32, or
// in bfloat16 when the tape's policy says so (fused_attention_bf16; the projections are
// matmul_bf16 then).
float float_fused_run(Tape<float>& tape, const FloatInputs& in) {
    tape.clear();
    const Var<float> X = tape.leaf(in.X), W_Q = tape.leaf(in.W_Q), W_K = tape.leaf(in.W_K), W_V = tape.leaf(in.W_V);
    const Var<float> O = fused_attention(matmul(X, W_Q), matmul(X, W_K), matmul(X, W_V), false, 0);
    tape.backward(O, in.G);
    return X.grad()[0];
}

// The float step against the bfloat16 one, alternated round by round (timing.hpp), best and
// median per call; CPU time of this thread on one thread (the work itself on a shared machine),
// wall time on more (the pool's threads do the work).
void print_float_line(std::size_t T, std::size_t d, unsigned threads, const BenchInputs& in) {
    const FloatInputs inputs(in);
    Tape<float> f32, bf16;
    bf16.set_product_precision(ProductPrecision::bfloat16);
    float_fused_run(f32, inputs);  // warm-up: each tape's buffers allocated once
    float_fused_run(bf16, inputs);
    const std::size_t rounds = T <= 1024 ? 11 : (T <= 4096 ? 5 : 3);
    const std::vector<timing::Timing> t =
        timing::alternate_timings({[&] { float_fused_run(f32, inputs); }, [&] { float_fused_run(bf16, inputs); }},
                                  rounds, 0.2, threads == 1 ? timing::thread_seconds : timing::wall_seconds);
    fmt::print(
        "fused_float T={} d={} threads={} cpu={} rounds={} float32_us={:.0f} float32_median_us={:.0f} "
        "bfloat16_us={:.0f} bfloat16_median_us={:.0f} bfloat16_over_float32_best={:.2f} "
        "bfloat16_over_float32_median={:.2f}\n",
        T, d, threads, cpu_level_name(cpu_level()), rounds, t[0].best_us, t[0].median_us, t[1].best_us, t[1].median_us,
        t[0].best_us / t[1].best_us, t[0].median_us / t[1].median_us);
}

// One composed forward + backward on `tape`, cleared first: its nodes' T×T buffers are kept and
// reused from one run to the next.
double composed_run(Tape<double>& tape, const BenchInputs& in) {
    tape.clear();
    const Var<double> X = tape.leaf(in.X), W_Q = tape.leaf(in.W_Q), W_K = tape.leaf(in.W_K), W_V = tape.leaf(in.W_V);
    const Var<double> O = attention(X, W_Q, W_K, W_V).O;
    tape.backward(O, in.G);
    return O.value()[0];
}

#ifdef TAPEGRAD_HAVE_TORCH
torch::Tensor to_torch(const Tensor<double>& t, bool requires_grad) {
    const auto data = t.data();
    return torch::from_blob(const_cast<double*>(data.data()),
                            {static_cast<long>(t.rows()), static_cast<long>(t.cols())}, torch::kFloat64)
        .clone()
        .set_requires_grad(requires_grad);
}

double libtorch_run(const BenchInputs& in) {
    const torch::Tensor X = to_torch(in.X, true), W_Q = to_torch(in.W_Q, true), W_K = to_torch(in.W_K, true),
                        W_V = to_torch(in.W_V, true), G = to_torch(in.G, false);
    const torch::Tensor Q = X.matmul(W_Q), K = X.matmul(W_K), V = X.matmul(W_V);
    const torch::Tensor S = Q.matmul(K.transpose(0, 1)) / std::sqrt(double(in.W_Q.cols()));
    const torch::Tensor O = torch::softmax(S, -1).matmul(V);
    O.backward(G);
    return X.grad().index({0, 0}).item<double>();
}
#endif

}  // namespace

int main(int argc, char** argv) {
    tapegrad::timing::keep_freed_memory();  // before any contender allocates (timing.hpp says why)
    std::vector<std::size_t> sizes;
    std::vector<unsigned> thread_counts;
    bool fused_only = false;
    try {  // numbers read the way every program of the project reads them (tools/options.hpp)
        for (int a = 1; a < argc; ++a) {
            const std::string arg = argv[a];
            if (arg == "--fused-only") {
                fused_only = true;
            } else if (arg == "--threads") {
                if (a + 1 == argc) throw cli::usage_error("--threads needs a number");
                thread_counts.push_back(cli::integer_argument("--threads", argv[++a], 1u, cli::max_threads));
            } else {
                sizes.push_back(cli::integer_argument("a size T", arg, std::size_t{1}, std::size_t{1} << 20));
            }
        }
    } catch (const cli::usage_error& e) {
        fmt::print(stderr, "bench_fused: {} (usage: bench_fused [--fused-only] [--threads N]... [T]...)\n", e.what());
        return cli::exit_usage;
    }
    if (sizes.empty()) sizes = {1024, 4096, 16384};
    if (thread_counts.empty()) thread_counts = {1, 2};
    const std::size_t d = 64;
    timing::print_host_line();
    fmt::print("# fused attention benchmark: D = d = r = {}, double, forward + backward, best of runs\n", d);
    for (const unsigned threads : thread_counts) {
        set_threads(threads);  // the fused op's tiles and tapegrad's products (composed graph) alike
#ifdef TAPEGRAD_HAVE_TORCH
        torch::set_num_threads(static_cast<int>(threads));
#endif
        for (const std::size_t T : sizes) {
            const BenchInputs in = make_inputs(T, d);
            const int runs = T <= 1024 ? 5 : (T <= 4096 ? 3 : 1);
            double extra = 0;
            // The memory measurement counts the tape's own allocations, so it needs a tape that
            // holds no buffers: one made on a new thread, whose pool of dead tapes' nodes is empty
            // (on this thread a new tape would take the nodes the last dead tape left).
            std::thread([&] {
                Tape<double> fresh;
                extra = fused_run(fresh, in, true);
            }).join();
            // One tape per benchmark, reused by every run (tape.clear() between runs); an untimed
            // first run allocates (and faults in) its buffers, for the fused and composed graphs alike.
            Tape<double> fused_tape;
            fused_run(fused_tape, in, false);
            const Timing fused = best_of(runs, [&] { fused_run(fused_tape, in, false); });
            std::string composed = "na", libtorch = "na", composed_cpu = "na", libtorch_cpu = "na";
            if (T <= 4096 && !fused_only) {
                Tape<double> composed_tape;
                composed_run(composed_tape, in);  // warm-up
                const Timing c = best_of(runs, [&] { composed_run(composed_tape, in); });
                composed = fmt::format("{:.0f}", c.wall_us);
                composed_cpu = fmt::format("{:.0f}", c.cpu_us);
#ifdef TAPEGRAD_HAVE_TORCH
                libtorch_run(in);  // warm-up
                const Timing t = best_of(runs, [&] { libtorch_run(in); });
                libtorch = fmt::format("{:.0f}", t.wall_us);
                libtorch_cpu = fmt::format("{:.0f}", t.cpu_us);
#endif
            }
            // Wall times first (the format), then CPU times of the same runs.
            const double flops = 7.0 * 2.0 * double(T) * double(T) * double(d);
            // GFLOP/s on the best wall time, and on the best CPU time (the work itself when one
            // thread runs on a shared machine).
            fmt::print("fused T={} d={} threads={} cpu={} fused_us={:.0f} fused_median_us={:.0f} fused_gflops={:.1f} "
                       "composed_us={} libtorch_us={} peak_mib={:.2f} fused_cpu_us={:.0f} fused_cpu_gflops={:.1f} "
                       "composed_cpu_us={} libtorch_cpu_us={}\n",
                       T, d, threads, cpu_level_name(cpu_level()), fused.wall_us, fused.median_wall_us,
                       flops / fused.wall_us / 1e3, composed, libtorch, extra / (1024.0 * 1024.0), fused.cpu_us,
                       flops / fused.cpu_us / 1e3, composed_cpu, libtorch_cpu);
            std::fflush(stdout);
            print_float_line(T, d, threads, in);
            std::fflush(stdout);
        }
    }
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    fmt::print("# process max RSS {:.0f} MiB (includes the composed graphs)\n", double(usage.ru_maxrss) / 1024.0);
}
