// bench_attention: times tapegrad against LibTorch on the spec's single-head attention graph
// (Q, K, V projections from X, scores Q·Kᵀ/√d, softmax, A·V, probe J = Σ O∘G, backward), in
// double and in float (dtype= on each line), in the same run, alternating the two so that both
// see the same machine state; best and median of the rounds on each side, the kernels' CPU level
// (cpu=, autodiff/cpu.hpp) on each line, and the T = 2 graph on a reused tape and on a fresh
// Tape per step; on two or more cores, T = 1024 on two threads, against LibTorch on two and
// against one thread of ours alternated in the same run (attention_threads lines). Built with
// the library's ordinary flags (no -march=native). Also
// times Q, K, V as one X·[W_Q W_K W_V] product against three (issue 10 part 3), the tape's
// per-node overhead, a 1024³ matmul against a reference GEMM (OpenBLAS when
// found, else Eigen), the full 50-digit gradient check of attention at T = D = d = 8, and
// reports peak memory. One line per measurement, `key=value` fields, so the output can be
// pasted into the README and diffed between runs.
#include "inputs.hpp"
#include "tapegrad.hpp"
#include "host.hpp"
#include "timing.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <Eigen/Core>  // the reference product when OpenBLAS is not found (compiled with this file's flags)

#ifdef TAPEGRAD_HAVE_TORCH
#include <torch/torch.h>
#endif
#ifdef TAPEGRAD_HAVE_OPENBLAS
#include <cblas.h>
#endif

using namespace tapegrad;
using Clock = std::chrono::steady_clock;

namespace {

using bench::AttentionInputs;
using bench::make_inputs;
using bench::random_tensor;
using timing::alternate_timings;
using timing::ClockFunction;
using timing::median;
using timing::thread_seconds;
using timing::Timing;
using timing::wall_seconds;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// How the step computes Q, K and V: three products X·W_Q, X·W_K, X·W_V (models/attention.hpp), or
// the experiment of issue 10 part 3, one product X·[W_Q W_K W_V] cut into its three column blocks
// (concat, matmul, slice), whose backward is then one dX and one d[W_Q W_K W_V] product.
enum class Projections { three_products, one_product };

// Forward and backward in T (double or float), on one reused tape (clear() keeps every node's
// buffers) or on a fresh Tape per step, as most training loops are written.
template <Scalar T>
class TapegradAttention {
public:
    TapegradAttention(const AttentionInputs& in, bool fresh_tape,
                      Projections projections = Projections::three_products)
        : X_(tensor_cast<T>(in.X)), W_Q_(tensor_cast<T>(in.W_Q)), W_K_(tensor_cast<T>(in.W_K)),
          W_V_(tensor_cast<T>(in.W_V)), G_(tensor_cast<T>(in.G)), fresh_tape_(fresh_tape), projections_(projections) {}
    void run() {
        if (fresh_tape_) {
            Tape<T> tape;
            step(tape);
        } else {
            tape_.clear();
            step(tape_);
        }
    }
    const Tensor<T>& grad_W_Q() const { return grad_W_Q_; }
    std::size_t bytes_held() const {
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < tape_.size(); ++i) bytes += tape_.info(i).bytes;
        return bytes;
    }

private:
    void step(Tape<T>& tape) {
        const Var<T> X = tape.leaf(X_, "X");
        const Var<T> W_Q = tape.leaf(W_Q_, "W_Q");
        const Var<T> W_K = tape.leaf(W_K_, "W_K");
        const Var<T> W_V = tape.leaf(W_V_, "W_V");
        const Var<T> G = tape.constant(G_, "G");
        const AttentionResult<T> r = projections_ == Projections::three_products ? attention(X, W_Q, W_K, W_V)
                                                                                  : stacked_attention(X, W_Q, W_K, W_V);
        const Var<T> J = sum(mul(r.O, G));
        tape.backward(J);
        if (grad_W_Q_.size() == 0) grad_W_Q_ = W_Q.grad();  // kept once, for the comparison
    }
    static AttentionResult<T> stacked_attention(const Var<T>& X, const Var<T>& W_Q, const Var<T>& W_K,
                                                const Var<T>& W_V) {
        const std::size_t d = W_Q.shape().cols();
        const Var<T> QKV = matmul(X, concat({W_Q, W_K, W_V}, -1));
        return attention_from_qkv(slice(QKV, -1, 0, d), slice(QKV, -1, d, 2 * d), slice(QKV, -1, 2 * d, 3 * d));
    }
    Tensor<T> X_, W_Q_, W_K_, W_V_, G_;
    bool fresh_tape_;
    Projections projections_;
    Tape<T> tape_;
    Tensor<T> grad_W_Q_;
};

template <Scalar T>
constexpr std::string_view dtype_name = std::is_same_v<T, float> ? "float32" : "double";

#ifdef TAPEGRAD_HAVE_TORCH
template <Scalar T>
torch::Tensor to_torch(const Tensor<double>& t, bool requires_grad) {
    return bench::to_torch(t, requires_grad, std::is_same_v<T, float> ? torch::kFloat : torch::kDouble);
}

template <Scalar T>
class TorchAttention {
public:
    TorchAttention(const AttentionInputs& in, std::size_t d)
        : X_(to_torch<T>(in.X, true)),
          W_Q_(to_torch<T>(in.W_Q, true)),
          W_K_(to_torch<T>(in.W_K, true)),
          W_V_(to_torch<T>(in.W_V, true)),
          G_(to_torch<T>(in.G, false)),
          scale_(1.0 / std::sqrt(static_cast<double>(d))) {}
    void run() {
        for (torch::Tensor* leaf : {&X_, &W_Q_, &W_K_, &W_V_}) leaf->mutable_grad() = torch::Tensor();  // set_to_none
        const torch::Tensor Q = X_.matmul(W_Q_);
        const torch::Tensor K = X_.matmul(W_K_);
        const torch::Tensor V = X_.matmul(W_V_);
        const torch::Tensor S = Q.matmul(K.transpose(0, 1)) * scale_;
        const torch::Tensor A = torch::softmax(S, -1);
        const torch::Tensor O = A.matmul(V);
        const torch::Tensor J = (O * G_).sum();
        J.backward();
    }
    Tensor<T> grad_W_Q() const {
        const torch::Tensor g = W_Q_.grad().contiguous();
        Tensor<T> out(Shape{static_cast<std::size_t>(g.size(0)), static_cast<std::size_t>(g.size(1))});
        std::copy(g.data_ptr<T>(), g.data_ptr<T>() + g.numel(), out.data().begin());
        return out;
    }

private:
    torch::Tensor X_, W_Q_, W_K_, W_V_, G_;
    double scale_;
};
#endif

// Two computations of one gradient must agree to rounding: in double to 1e-9. In float the
// unit-normal inputs give scores of standard deviation about 64 (softmax nearly one-hot), whose
// absolute rounding (2^-24 of sums of 64 terms of size ~64) moves the weights by ~1e-3 relative on
// either side: 0.1 still catches a wrong graph, which misses by O(1).
template <Scalar T>
constexpr double agreement = std::is_same_v<T, float> ? 1e-1 : 1e-9;

// The largest difference between two tensors, relative to the first where it exceeds 1.
template <Scalar T>
double worst_difference(const Tensor<T>& reference, const Tensor<T>& other) {
    double worst = 0;
    for (std::size_t k = 0; k < reference.size(); ++k) {
        worst = std::max(worst, double(std::abs(reference[k] - other[k]) / std::max(T(1), std::abs(reference[k]))));
    }
    return worst;
}

// threads = 1: both on this thread, timed by its CPU clock. threads > 1: tapegrad's products and
// LibTorch's intra-op pool both get that many threads, timed by the wall clock.
template <Scalar T>
void bench_attention(std::size_t rows, std::size_t D, std::size_t d, std::mt19937_64& rng, unsigned threads = 1,
                     bool fresh_tape = false) {
    set_threads(threads);
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(static_cast<int>(threads));
#endif
    const ClockFunction now = threads == 1 ? thread_seconds : wall_seconds;
    const AttentionInputs inputs = make_inputs(rows, D, d, rng);
    TapegradAttention<T> ours(inputs, fresh_tape);
    // Big graphs take milliseconds per call: fewer, shorter rounds keep the whole run short.
    const std::size_t rounds = rows >= 1024 ? 9 : 15;
    const double batch = rows >= 1024 ? 0.03 : 0.02;
    const std::string line = fmt::format("attention dtype={} T={} D={} d={} tape={} threads={} cpu={}", dtype_name<T>,
                                         rows, D, d, fresh_tape ? "fresh" : "reused", threads,
                                         cpu_level_name(cpu_level()));
#ifdef TAPEGRAD_HAVE_TORCH
    TorchAttention<T> theirs(inputs, d);
    const std::vector<Timing> us = alternate_timings({[&] { ours.run(); }, [&] { theirs.run(); }}, rounds, batch, now);
    // Same graph, same numbers: the gradients must agree to rounding (agreement<T>).
    const double worst = worst_difference(theirs.grad_W_Q(), ours.grad_W_Q());
    if (worst > agreement<T>) {
        fmt::print("WARNING: dW_Q differs from LibTorch's by {:.3g} at T={} dtype={}\n", worst, rows, dtype_name<T>);
    }
    fmt::print("{} tapegrad_us_best={:.3f} tapegrad_us_median={:.3f} libtorch_us_best={:.3f} libtorch_us_median={:.3f} "
               "ratio_median={:.4f} ratio_best={:.4f}\n",
               line, us[0].best_us, us[0].median_us, us[1].best_us, us[1].median_us, us[0].median_us / us[1].median_us,
               us[0].best_us / us[1].best_us);
#else
    const std::vector<Timing> us = alternate_timings({[&] { ours.run(); }}, rounds, batch, now);
    fmt::print("{} tapegrad_us_best={:.3f} tapegrad_us_median={:.3f} libtorch_us=NA ratio=NA\n", line, us[0].best_us,
               us[0].median_us);
#endif
    set_threads(1);
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(1);
#endif
    if (rows >= 1024 && threads == 1 && !fresh_tape) {
        fmt::print("tape_bytes dtype={} T={} D={} d={} bytes={}\n", dtype_name<T>, rows, D, d, ours.bytes_held());
    }
}

// Two threads against one on the same graph, alternating rounds, both on the wall clock: the
// speed-up measured in the same minutes (the lines above time one thread and two threads in
// separate runs against LibTorch, minutes apart on a host whose second core varies). Results do
// not depend on the threads: the two sides' dW_Q must be equal to the bit. A third contender
// measures what this host gives two threads on this work with nothing shared: two independent
// steps at once, each on its own thread and tape (no hand-over, no data crossing cores), timed per
// step. One step split over two threads can hardly beat that: it is the host's limit
// (host_limit = one thread's step over that per-step time).
template <Scalar T>
void bench_attention_threads(std::size_t rows, std::size_t D, std::size_t d, std::mt19937_64& rng) {
    const AttentionInputs inputs = make_inputs(rows, D, d, rng);
    TapegradAttention<T> one(inputs, false), two(inputs, false), left(inputs, false), right(inputs, false);
    const std::vector<Timing> us =
        alternate_timings({[&] {
                               set_threads(1);
                               one.run();
                           },
                           [&] {
                               set_threads(2);
                               two.run();
                           },
                           [&] {
                               // each step inside an item: its own calls run inline
                               set_threads(2);
                               parallel_for(2, [&](std::size_t side, unsigned) { (side == 0 ? left : right).run(); });
                           }},
                          21, 0.03, wall_seconds);
    set_threads(1);
    const bool same = one.grad_W_Q() == two.grad_W_Q() && one.grad_W_Q() == left.grad_W_Q();
    if (!same) fmt::print("WARNING: dW_Q differs between one thread and two at T={} dtype={}\n", rows, dtype_name<T>);
    const double pair_median = us[2].median_us / 2, pair_best = us[2].best_us / 2;  // per step
    fmt::print(
        "attention_threads dtype={} T={} D={} d={} cpu={} one_thread_us_median={:.1f} two_threads_us_median={:.1f} "
        "speedup_median={:.3f} one_thread_us_best={:.1f} two_threads_us_best={:.1f} speedup_best={:.3f} "
        "two_steps_at_once_us_per_step_median={:.1f} host_limit_median={:.3f} host_limit_best={:.3f} "
        "bitwise_equal={}\n",
        dtype_name<T>, rows, D, d, cpu_level_name(cpu_level()), us[0].median_us, us[1].median_us,
        us[0].median_us / us[1].median_us, us[0].best_us, us[1].best_us, us[0].best_us / us[1].best_us, pair_median,
        us[0].median_us / pair_median, us[0].best_us / pair_best, same);
}

// The README's table in one precision: T = 2 on a reused and a fresh tape, then 64, 256, 1024.
template <Scalar T>
void bench_attention_table(std::mt19937_64& rng, unsigned cores) {
    bench_attention<T>(2, 2, 2, rng, 1, false);
    bench_attention<T>(2, 2, 2, rng, 1, true);
    for (const std::size_t rows : {64, 256, 1024}) bench_attention<T>(rows, 64, 64, rng);
    bench_attention<T>(1024, 64, 64, rng, 1, true);
    if (cores > 1) {
        bench_attention<T>(1024, 64, 64, rng, 2);
        bench_attention_threads<T>(1024, 64, 64, rng);
    }
}

// Issue 10 part 3: would one X·[W_Q W_K W_V] product beat three? Two measurements, alternated:
// the whole step both ways (the one-product step pays for the concat of the weights and the
// slices of Q, K, V, and their VJPs), and the products alone (the three forward products, the
// three dX products and the three dW products, against one of each three times as wide): the gain
// a copy-free implementation could reach at most.
template <Scalar T>
void bench_projections(std::size_t rows, std::size_t D, std::size_t d, std::mt19937_64& rng) {
    const AttentionInputs inputs = make_inputs(rows, D, d, rng);
    TapegradAttention<T> three(inputs, false, Projections::three_products);
    TapegradAttention<T> one(inputs, false, Projections::one_product);
    const std::vector<Timing> step = alternate_timings({[&] { three.run(); }, [&] { one.run(); }}, 15, 0.02, thread_seconds);
    if (worst_difference(three.grad_W_Q(), one.grad_W_Q()) > agreement<T>) {
        fmt::print("WARNING: dW_Q differs between the two ways of projecting at T={} dtype={}\n", rows, dtype_name<T>);
    }
    using kernels::Form;
    std::vector<T> X(rows * D, T(0.5)), W(D * 3 * d, T(0.25)), QKV(rows * 3 * d, T(0.1)), dX(rows * D), dW(D * 3 * d);
    const auto block = [&](std::vector<T>& m, std::size_t b) { return m.data() + b * m.size() / 3; };
    const auto three_products = [&] {
        for (std::size_t b = 0; b < 3; ++b) kernels::gemm(Form::ab, rows, d, D, X.data(), block(W, b), block(QKV, b), false);
        for (std::size_t b = 0; b < 3; ++b) kernels::gemm(Form::abT, rows, D, d, block(QKV, b), block(W, b), dX.data(), b > 0);
        for (std::size_t b = 0; b < 3; ++b) kernels::gemm(Form::aTb, D, d, rows, X.data(), block(QKV, b), block(dW, b), false);
    };
    const auto one_product = [&] {
        kernels::gemm(Form::ab, rows, 3 * d, D, X.data(), W.data(), QKV.data(), false);
        kernels::gemm(Form::abT, rows, D, 3 * d, QKV.data(), W.data(), dX.data(), false);
        kernels::gemm(Form::aTb, D, 3 * d, rows, X.data(), QKV.data(), dW.data(), false);
    };
    const std::vector<Timing> products = alternate_timings({three_products, one_product}, 15, 0.02, thread_seconds);
    fmt::print("projections dtype={} T={} D={} d={} cpu={} step_three_us_median={:.3f} step_one_us_median={:.3f} "
               "step_ratio_median={:.4f} step_ratio_best={:.4f} products_three_us_median={:.3f} "
               "products_one_us_median={:.3f} products_saving_of_step={:.4f}\n",
               dtype_name<T>, rows, D, d, cpu_level_name(cpu_level()), step[0].median_us, step[1].median_us,
               step[1].median_us / step[0].median_us, step[1].best_us / step[0].best_us, products[0].median_us,
               products[1].median_us, (products[0].median_us - products[1].median_us) / step[0].median_us);
}

// A long chain of scales of a one-element tensor: the work per node is one multiply, so the
// time is the tape's own cost (recording, the reverse sweep, accumulation).
void bench_tape_overhead() {
    constexpr std::size_t nodes = 100'000;
    Tape<double> tape;
    const Tensor<double> start = Tensor<double>::scalar(1.0);
    const auto chain = [&] {
        tape.clear();
        Var<double> x = tape.leaf(start, "x");
        const Var<double> first = x;
        for (std::size_t i = 0; i < nodes; ++i) x = scale(x, 1.0000001);
        tape.backward(x);
        return first.grad()[0];
    };
    chain();  // first pass allocates the nodes; later passes reuse them
    std::vector<double> samples;
    for (int round = 0; round < 15; ++round) {
        const double t0 = thread_seconds();
        chain();
        samples.push_back((thread_seconds() - t0) * 1e9 / static_cast<double>(nodes + 1));
    }
    fmt::print("tape_overhead cpu={} nodes={} ns_per_node={:.2f}\n", cpu_level_name(cpu_level()), nodes + 1, median(samples));
}

void bench_matmul(std::size_t n, std::mt19937_64& rng) {
    const Tensor<double> A = random_tensor(Shape{n, n}, rng), B = random_tensor(Shape{n, n}, rng);
    Tape<double> tape;
    const auto ours = [&] {
        tape.clear();
        const Var<double> C = matmul(tape.leaf(A, "A", false), tape.leaf(B, "B", false));
        return C.value()[0];
    };
    Tensor<double> C_reference(Shape{n, n});
#ifdef TAPEGRAD_HAVE_OPENBLAS
    const char* reference_name = "openblas";
    openblas_set_num_threads(1);
    const auto reference = [&] {
        const int ni = static_cast<int>(n);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0, A.data().data(), ni, B.data().data(),
                    ni, 0.0, C_reference.data().data(), ni);
    };
#else
    const char* reference_name = "eigen-as-compiled-here";
    const auto reference = [&] {
        using M = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
        const auto ni = Eigen::Index(n);
        Eigen::Map<M>(C_reference.data().data(), ni, ni).noalias() =
            Eigen::Map<const M>(A.data().data(), ni, ni) * Eigen::Map<const M>(B.data().data(), ni, ni);
    };
#endif
    // tapegrad at every level the CPU supports (TAPEGRAD_CPU's level restored after), then the reference.
    const CpuLevel chosen = cpu_level();
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    const auto gflops_of = [&](const auto& work) {
        work();
        std::vector<double> seconds;
        for (int round = 0; round < 7; ++round) {
            const double t0 = thread_seconds();
            work();
            seconds.push_back(thread_seconds() - t0);
        }
        return flops / median(std::move(seconds)) / 1e9;
    };
    const double reference_gflops = gflops_of(reference);
    for (const CpuLevel level : available_cpu_levels()) {
        set_cpu_level(level);
        const double ours_gflops = gflops_of(ours);
        fmt::print("matmul n={} cpu={} tapegrad_gflops={:.1f} reference_gflops={:.1f} ratio={:.3f} reference={}\n", n,
                   cpu_level_name(level), ours_gflops, reference_gflops, ours_gflops / reference_gflops,
                   reference_name);
    }
    set_cpu_level(chosen);
}

// The full 50-digit check of attention over X, W_Q, W_K, W_V (every coordinate, two steps,
// both precisions, the branches of X), as the test suite runs it.
void bench_gradcheck(std::size_t T, std::size_t D, std::size_t d, std::mt19937_64& rng) {
    const AttentionInputs in = make_inputs(T, D, d, rng);
    const NamedTensor leaves[] = {{"X", in.X}, {"W_Q", in.W_Q}, {"W_K", in.W_K}, {"W_V", in.W_V}};
    const Tensor<double> G = in.G;
    const auto graph = [&G](auto vars) {
        auto [X, W_Q, W_K, W_V] = vars;
        using T = typename decltype(X)::scalar_type;
        const AttentionResult<T> r = attention(X, W_Q, W_K, W_V);
        return sum(mul(r.O, X.tape().constant(tensor_cast<T>(G), "G")));
    };
    std::vector<double> samples;
    CheckReport report;
    for (int round = 0; round < 3; ++round) {
        const auto t0 = Clock::now();
        report = check_gradients(graph, leaves);
        samples.push_back(seconds_since(t0));
    }
    fmt::print("gradcheck T={} D={} d={} seconds={:.4f} passed={} coordinates={} max_error_mp={:.2e} "
               "max_error_double={:.2e}\n",
               T, D, d, median(samples), report.passed, report.coordinates, report.max_error_mp,
               report.max_error_double);
}

}  // namespace

// Arguments select parts ("attention", "attention_float", "projections", "overhead", "matmul",
// "gradcheck"); none runs them all. TAPEGRAD_CPU=baseline|avx2|avx512|avx512_bf16 forces the kernels' level.
int main(int argc, char** argv) {
    tapegrad::timing::keep_freed_memory();  // before any contender allocates (timing.hpp says why)
    const std::vector<std::string> parts(argv + 1, argv + argc);
    constexpr std::array<std::string_view, 6> known{"attention", "attention_float", "projections", "overhead", "matmul",
                                                     "gradcheck"};
    for (const std::string& part : parts) {
        if (std::find(known.begin(), known.end(), part) == known.end()) {
            fmt::print(stderr, "bench_attention: unknown part '{}' (usage: bench_attention [{}]...)\n", part,
                       fmt::join(known, "|"));
            return 2;  // a bad command line, as in every program of the project (tools/options.hpp)
        }
    }
    const auto wanted = [&](const std::string& part) {
        return parts.empty() || std::find(parts.begin(), parts.end(), part) != parts.end();
    };
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    const unsigned cores = std::thread::hardware_concurrency();
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(1);
    const int torch_threads = torch::get_num_threads();
#else
    const int torch_threads = 0;
#endif
    fmt::print("environment cores={} OPENBLAS_CORETYPE={} libtorch_threads={} cpu={}\n", cores,
               coretype ? coretype : "unset", torch_threads, cpu_level_name(cpu_level()));

    timing::print_host_line();
    set_threads(1);  // one thread unless a line says otherwise
    std::mt19937_64 rng(20261129);
    if (wanted("attention")) bench_attention_table<double>(rng, cores);
    if (wanted("attention_float")) bench_attention_table<float>(rng, cores);
    if (wanted("projections")) {
        for (const std::size_t rows : {64, 256, 1024}) {
            bench_projections<double>(rows, 64, 64, rng);
            bench_projections<float>(rows, 64, 64, rng);
        }
    }
    if (wanted("overhead")) bench_tape_overhead();
    if (wanted("matmul")) bench_matmul(1024, rng);
    // Wall clock here: the checker runs on the library's default threads (every core).
    if (wanted("gradcheck")) {
        set_threads(0);
        bench_gradcheck(8, 8, 8, rng);
    }

    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    fmt::print("memory peak_rss_mb={:.1f}\n", static_cast<double>(usage.ru_maxrss) / 1024.0);
    return 0;
}
