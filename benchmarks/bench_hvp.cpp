// bench_hvp: forward mode and second order on the spec's attention graph (Q, K, V projections
// from X, scores Q·Kᵀ/√d, softmax, A·V, probe J = Σ O∘G), in double, one thread:
//   hvp   tapegrad's Hessian-vector product over X, W_Q, W_K, W_V (forward over reverse on a dual
//         tape) against one tapegrad gradient on the same graph and against LibTorch's HVP by
//         double backward (torch::autograd::grad with create_graph), timed side by side in
//         alternating batches; LibTorch's own gradient too, for its HVP/gradient ratio.
//   jvp   tapegrad's JVP of O along a direction over all four leaves against the forward pass alone.
//   hvp_check  the 50-digit HVP check (check/second_order.hpp) of the graph at T = D = d = 8.
// Each timing line gives the median and the best batch (µs per call); `ratio` is the median time
// over the line's reference (the gradient for hvp, the forward for jvp).
#include "inputs.hpp"
#include "tapegrad.hpp"
#include "host.hpp"
#include "timing.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace tapegrad;

namespace {

using bench::AttentionInputs;
using timing::Timing;

// The graph, generic in the scalar type, over the leaves X, W_Q, W_K, W_V.
auto spec_graph(const Tensor<double>& G) {
    return [&G](auto in) {
        using T = typename std::decay_t<decltype(in[0])>::scalar_type;
        return sum(mul(attention(in[0], in[1], in[2], in[3]).O, in[0].tape().constant(tensor_cast<T>(G), "G")));
    };
}

std::array<Tensor<double>, 4> leaves_of(const AttentionInputs& in) { return {in.X, in.W_Q, in.W_K, in.W_V}; }

// One gradient on a reused double tape.
struct TapegradGradient {
    const AttentionInputs& in;
    Tape<double> tape;
    void run() {
        tape.clear();
        std::array<Var<double>, 4> leaves{tape.leaf(in.X), tape.leaf(in.W_Q), tape.leaf(in.W_K), tape.leaf(in.W_V)};
        tape.backward(spec_graph(in.G)(leaves));
    }
};

// The forward pass alone on a reused double tape (what a JVP is compared with).
struct TapegradForward {
    const AttentionInputs& in;
    Tape<double> tape;
    void run() {
        tape.clear();
        std::array<Var<double>, 4> leaves{tape.leaf(in.X, "X", false), tape.leaf(in.W_Q, "W_Q", false),
                                          tape.leaf(in.W_K, "W_K", false), tape.leaf(in.W_V, "W_V", false)};
        attention(leaves[0], leaves[1], leaves[2], leaves[3]);
    }
};

#ifdef TAPEGRAD_HAVE_TORCH
// LibTorch: the HVP by double backward, g = ∇J with create_graph, then ∇⟨g, v⟩; and the gradient.
struct TorchGraph {
    std::vector<torch::Tensor> leaves, v;
    torch::Tensor G;
    double scale;
    TorchGraph(const AttentionInputs& in, const std::array<Tensor<double>, 4>& direction)
        : G(bench::to_torch(in.G, false)), scale(1.0 / std::sqrt(static_cast<double>(in.W_Q.cols()))) {
        for (const Tensor<double>* x : {&in.X, &in.W_Q, &in.W_K, &in.W_V}) leaves.push_back(bench::to_torch(*x, true));
        for (const Tensor<double>& t : direction) v.push_back(bench::to_torch(t, false));
    }
    torch::Tensor loss() const {
        const torch::Tensor Q = leaves[0].matmul(leaves[1]), K = leaves[0].matmul(leaves[2]), V = leaves[0].matmul(leaves[3]);
        const torch::Tensor A = torch::softmax(Q.matmul(K.transpose(0, 1)) * scale, -1);
        return (A.matmul(V) * G).sum();
    }
    std::vector<torch::Tensor> hvp() const {
        const std::vector<torch::Tensor> g = torch::autograd::grad({loss()}, leaves, {}, true, true);
        torch::Tensor dot = (g[0] * v[0]).sum();
        for (std::size_t l = 1; l < g.size(); ++l) dot = dot + (g[l] * v[l]).sum();
        return torch::autograd::grad({dot}, leaves);
    }
    std::vector<torch::Tensor> gradient() const { return torch::autograd::grad({loss()}, leaves); }
};

// Largest mixed difference between tapegrad's and LibTorch's H·v (same graph, same numbers).
double hvp_difference(const std::array<Tensor<double>, 4>& ours, const std::vector<torch::Tensor>& theirs) {
    double worst = 0;
    for (std::size_t l = 0; l < 4; ++l) {
        const torch::Tensor t = theirs[l].contiguous();
        for (std::size_t k = 0; k < ours[l].size(); ++k) {
            const double r = t.data_ptr<double>()[k];
            worst = std::max(worst, std::abs(ours[l][k] - r) / std::max(1.0, std::abs(r)));
        }
    }
    return worst;
}
#endif

std::array<Tensor<double>, 4> direction_like(const std::array<Tensor<double>, 4>& x, std::mt19937_64& rng) {
    std::array<Tensor<double>, 4> v;
    for (std::size_t l = 0; l < 4; ++l) v[l] = bench::random_tensor(x[l].shape(), rng);
    return v;
}

void bench_hvp(std::size_t T, std::size_t D, std::size_t d, std::mt19937_64& rng) {
    const AttentionInputs in = bench::make_inputs(T, D, d, rng);
    const std::array<Tensor<double>, 4> x = leaves_of(in), v = direction_like(x, rng);
    TapegradGradient gradient{in, {}};
    Tape<Dual<double>> dual_tape;
    const auto graph = spec_graph(in.G);
    HvpResult<double, 4> result{};  // reused, as the gradient's tape is
    std::vector<std::function<void()>> contenders{[&] { hvp(dual_tape, graph, x, v, result); }, [&] { gradient.run(); }};
#ifdef TAPEGRAD_HAVE_TORCH
    const TorchGraph torch_graph(in, v);
    std::vector<torch::Tensor> torch_Hv;
    contenders.push_back([&] { torch_Hv = torch_graph.hvp(); });
    contenders.push_back([&] { torch_graph.gradient(); });
#endif
    const std::vector<Timing> t = timing::alternate_timings(contenders, 15, 0.02);
    std::string line = fmt::format("hvp T={} D={} d={} threads=1 tapegrad_us={:.3f} gradient_us={:.3f}", T, D, d,
                                   t[0].median_us, t[1].median_us);
#ifdef TAPEGRAD_HAVE_TORCH
    line += fmt::format(" libtorch_us={:.3f} ratio={:.4f} vs_libtorch={:.4f} libtorch_gradient_us={:.3f} libtorch_ratio={:.4f}",
                        t[2].median_us, t[0].median_us / t[1].median_us, t[0].median_us / t[2].median_us,
                        t[3].median_us, t[2].median_us / t[3].median_us);
    line += fmt::format(" best: tapegrad_us={:.3f} gradient_us={:.3f} libtorch_us={:.3f} libtorch_gradient_us={:.3f}",
                        t[0].best_us, t[1].best_us, t[2].best_us, t[3].best_us);
    const double difference = hvp_difference(result.Hv, torch_Hv);
    if (difference > 1e-9) fmt::print("WARNING: H·v differs from LibTorch's by {:.3g} at T={}\n", difference, T);
#else
    line += fmt::format(" libtorch_us=NA ratio={:.4f} best: tapegrad_us={:.3f} gradient_us={:.3f}",
                        t[0].median_us / t[1].median_us, t[0].best_us, t[1].best_us);
#endif
    fmt::print("{}\n", line);
}

void bench_jvp(std::size_t T, std::size_t D, std::size_t d, std::mt19937_64& rng) {
    const AttentionInputs in = bench::make_inputs(T, D, d, rng);
    const std::array<Tensor<double>, 4> x = leaves_of(in), t = direction_like(x, rng);
    TapegradForward forward{in, {}};
    Tape<Dual<double>> dual_tape;
    const auto output = [](auto leaves) { return attention(leaves[0], leaves[1], leaves[2], leaves[3]).O; };
    JvpResult<double> result;
    const std::vector<Timing> us =
        timing::alternate_timings({[&] { jvp(dual_tape, output, x, t, result); }, [&] { forward.run(); }}, 15, 0.02);
    fmt::print("jvp T={} D={} d={} threads=1 tapegrad_us={:.3f} forward_us={:.3f} ratio={:.4f} best: tapegrad_us={:.3f} "
               "forward_us={:.3f}\n",
               T, D, d, us[0].median_us, us[1].median_us, us[0].median_us / us[1].median_us, us[0].best_us, us[1].best_us);
}

// The 50-digit HVP check over X, W_Q, W_K, W_V (three directions), wall clock, median of 3.
void bench_hvp_check(std::size_t T, std::size_t D, std::size_t d, std::mt19937_64& rng) {
    const AttentionInputs in = bench::make_inputs(T, D, d, rng);
    const NamedTensor leaves[] = {{"X", in.X}, {"W_Q", in.W_Q}, {"W_K", in.W_K}, {"W_V", in.W_V}};
    std::vector<double> seconds;
    SecondOrderReport report;
    for (int round = 0; round < 3; ++round) {
        const auto start = std::chrono::steady_clock::now();
        report = check_hvp(spec_graph(in.G), leaves);
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    fmt::print("hvp_check T={} D={} d={} seconds={:.4f} passed={} directions={} compared={} max_error_mp={:.2e} "
               "max_error_double={:.2e}\n",
               T, D, d, timing::median(seconds), report.passed, report.directions, report.compared, report.max_error_mp,
               report.max_error_double);
}

}  // namespace

int main(int argc, char** argv) {
    // No options: its sizes are fixed. An argument is a mistake (a `--rounds 1` meant for another
    // benchmark), refused as a bad command line rather than ignored by a run of the full benchmark.
    if (argc > 1) {
        fmt::print(stderr, "bench_hvp: takes no arguments, got '{}' (usage: bench_hvp)\n", argv[1]);
        return cli::exit_usage;
    }
    tapegrad::timing::keep_freed_memory();  // before any contender allocates (timing.hpp says why)
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(1);
#endif
    set_threads(1);
    timing::print_host_line();
    std::mt19937_64 rng(20261129);
    for (const std::size_t n : {8, 64}) bench_hvp(n, n, n, rng);
    for (const std::size_t n : {8, 64}) bench_jvp(n, n, n, rng);
    bench_hvp_check(8, 8, 8, rng);
    return 0;
}
