// bench_attention: times tapegrad against LibTorch on the spec's single-head attention graph
// (Q, K, V projections from X, scores Q·Kᵀ/√d, softmax, A·V, probe J = Σ O∘G, backward), in
// double, in the same run, alternating the two so that both see the same machine state. Also
// times the tape's per-node overhead, a 1024³ matmul against a reference GEMM (OpenBLAS when
// found, else Eigen), the full 50-digit gradient check of attention at T = D = d = 8, and
// reports peak memory. One line per measurement, `key=value` fields, so the output can be
// pasted into the README and diffed between runs.
#include "inputs.hpp"
#include "tapegrad.hpp"
#include "timing.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

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
#ifdef TAPEGRAD_HAVE_TORCH
using bench::to_torch;
#endif
using timing::alternate;
using timing::ClockFunction;
using timing::median;
using timing::thread_seconds;
using timing::wall_seconds;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Forward and backward on one reused tape (clear() keeps every node's buffers).
class TapegradAttention {
public:
    explicit TapegradAttention(const AttentionInputs& in) : in_(in) {}
    void run() {
        tape_.clear();
        const Var<double> X = tape_.leaf(in_.X, "X");
        W_Q_ = tape_.leaf(in_.W_Q, "W_Q");
        const Var<double> W_K = tape_.leaf(in_.W_K, "W_K");
        const Var<double> W_V = tape_.leaf(in_.W_V, "W_V");
        const Var<double> G = tape_.constant(in_.G, "G");
        const AttentionResult<double> r = attention(X, W_Q_, W_K, W_V);
        const Var<double> J = sum(mul(r.O, G));
        tape_.backward(J);
    }
    const Tensor<double>& grad_W_Q() const { return W_Q_.grad(); }
    std::size_t bytes_held() const {
        std::size_t bytes = 0;
        for (std::size_t i = 0; i < tape_.size(); ++i) bytes += tape_.info(i).bytes;
        return bytes;
    }

private:
    const AttentionInputs& in_;
    Tape<double> tape_;
    Var<double> W_Q_;
};

#ifdef TAPEGRAD_HAVE_TORCH
class TorchAttention {
public:
    TorchAttention(const AttentionInputs& in, std::size_t d)
        : X_(to_torch(in.X, true)),
          W_Q_(to_torch(in.W_Q, true)),
          W_K_(to_torch(in.W_K, true)),
          W_V_(to_torch(in.W_V, true)),
          G_(to_torch(in.G, false)),
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
    Tensor<double> grad_W_Q() const {
        const torch::Tensor g = W_Q_.grad().contiguous();
        Tensor<double> out(Shape{static_cast<std::size_t>(g.size(0)), static_cast<std::size_t>(g.size(1))});
        std::copy(g.data_ptr<double>(), g.data_ptr<double>() + g.numel(), out.data().begin());
        return out;
    }

private:
    torch::Tensor X_, W_Q_, W_K_, W_V_, G_;
    double scale_;
};
#endif

// threads = 1: both on this thread, timed by its CPU clock. threads > 1: tapegrad's products and
// LibTorch's intra-op pool both get that many threads, timed by the wall clock.
void bench_attention(std::size_t T, std::size_t D, std::size_t d, std::mt19937_64& rng, unsigned threads = 1) {
    set_threads(threads);
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(static_cast<int>(threads));
#endif
    const ClockFunction now = threads == 1 ? thread_seconds : wall_seconds;
    const AttentionInputs inputs = make_inputs(T, D, d, rng);
    TapegradAttention ours(inputs);
    // Big graphs take milliseconds per call: fewer, shorter rounds keep the whole run short.
    const std::size_t rounds = T >= 1024 ? 9 : 15;
    const double batch = T >= 1024 ? 0.03 : 0.02;
#ifdef TAPEGRAD_HAVE_TORCH
    TorchAttention theirs(inputs, d);
    const std::vector<double> us = alternate({[&] { ours.run(); }, [&] { theirs.run(); }}, rounds, batch, now);
    // Same graph, same numbers: the gradients must agree to double rounding.
    const Tensor<double> reference = theirs.grad_W_Q();
    double worst = 0;
    for (std::size_t k = 0; k < reference.size(); ++k) {
        worst = std::max(worst, std::abs(reference[k] - ours.grad_W_Q()[k]) / std::max(1.0, std::abs(reference[k])));
    }
    if (worst > 1e-9) fmt::print("WARNING: dW_Q differs from LibTorch's by {:.3g} at T={}\n", worst, T);
    fmt::print("attention T={} D={} d={} threads={} tapegrad_us={:.3f} libtorch_us={:.3f} ratio={:.4f}\n", T, D, d,
               threads, us[0], us[1], us[0] / us[1]);
#else
    const std::vector<double> us = alternate({[&] { ours.run(); }}, rounds, batch, now);
    fmt::print("attention T={} D={} d={} threads={} tapegrad_us={:.3f} libtorch_us=NA ratio=NA\n", T, D, d, threads,
               us[0]);
#endif
    set_threads(1);
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(1);
#endif
    if (T >= 1024 && threads == 1) fmt::print("tape_bytes T={} D={} d={} bytes={}\n", T, D, d, ours.bytes_held());
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
    fmt::print("tape_overhead nodes={} ns_per_node={:.2f}\n", nodes + 1, median(samples));
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
    const char* reference_name = "eigen";
    const auto reference = [&] {
        using M = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
        const auto ni = Eigen::Index(n);
        Eigen::Map<M>(C_reference.data().data(), ni, ni).noalias() =
            Eigen::Map<const M>(A.data().data(), ni, ni) * Eigen::Map<const M>(B.data().data(), ni, ni);
    };
#endif
    ours();
    reference();
    std::vector<double> ours_s, reference_s;
    for (int round = 0; round < 7; ++round) {
        double t0 = thread_seconds();
        ours();
        ours_s.push_back(thread_seconds() - t0);
        t0 = thread_seconds();
        reference();
        reference_s.push_back(thread_seconds() - t0);
    }
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    const double ours_gflops = flops / median(ours_s) / 1e9, reference_gflops = flops / median(reference_s) / 1e9;
    fmt::print("matmul n={} tapegrad_gflops={:.1f} reference_gflops={:.1f} ratio={:.3f} reference={}\n", n, ours_gflops,
               reference_gflops, ours_gflops / reference_gflops, reference_name);
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

// Arguments select parts ("attention", "overhead", "matmul", "gradcheck"); none runs them all.
int main(int argc, char** argv) {
    const std::vector<std::string> parts(argv + 1, argv + argc);
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
    fmt::print("environment cores={} OPENBLAS_CORETYPE={} libtorch_threads={} eigen_simd={}\n", cores,
               coretype ? coretype : "unset", torch_threads, Eigen::SimdInstructionSetsInUse());

    set_threads(1);  // one thread unless a line says otherwise
    std::mt19937_64 rng(20261129);
    if (wanted("attention")) {
        bench_attention(2, 2, 2, rng);
        for (const std::size_t T : {64, 256, 1024}) bench_attention(T, 64, 64, rng);
        if (cores > 1) bench_attention(1024, 64, 64, rng, 2);
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
