// bench_window: grouped-query attention with a causal sliding window and ALiBi's bias (today's
// decoders' attention: Mistral's window, BLOOM's and MPT's ALiBi), forward + backward, tapegrad's
// fused kernel against LibTorch's best CPU path for the same math, in one run, one thread each:
//   Q [1, H, T, dh], K, V [1, H_kv, T, dh] (leaves), g = H/H_kv query heads per key/value head,
//   S = Q·K_gᵀ/√dh − m_h·|i − j|, keys j outside i − w < j <= i hidden, O = softmax(S)·V_g,
//   backward seeded with a random G = dJ/dO (dQ, dK, dV).
// Contenders:
//   tapegrad   fused_attention(Q, repeat_heads(K, g), repeat_heads(V, g),
//              {.pattern = {.causal = true, .window = w, .alibi_heads = H}}) on one reused tape: the key tiles
//              outside every row's window are skipped, and no T×T matrix exists;
//   composed   LibTorch: Q·K_gᵀ/√dh + B, softmax, ·V_g, with B [H, T, T] (ALiBi's bias, −inf outside
//              the window) built once before the timing;
//   sdpa       LibTorch 1.13's at::_scaled_dot_product_attention(Q, K_g, V_g, B), its CPU path.
//              (K_g, V_g = repeat_interleave of K, V: LibTorch has no grouped-query kernel.)
// The ratio is tapegrad's time over the faster LibTorch contender's. Before timing, every
// contender's O, dQ, dK, dV are compared with tapegrad's (relative to each tensor's largest entry:
// 1e-10 in float64, 1e-3 in float32, where sums over up to T terms in another order differ by
// about T·2⁻²⁴), or a WARNING line says the lines do not time one computation.
// peak_mib: the largest heap the call holds beyond what was live before it (live_heap.hpp), each
// contender measured alone once: for tapegrad its tape's buffers, the output and the gradients;
// for LibTorch every tensor of the graph. It grows as T·w·… for the fused kernel (no T×T), as T²
// for LibTorch.
// Times are CPU seconds of this thread (timing.hpp), contenders alternating round by round; lines:
//   window T=… H=… H_kv=… dh=… w=… dtype=… contender=… best_ms=… median_ms=… peak_mib=… [ratio=…]
// after the host line with this run's GEMM rates (host.hpp). Run with OPENBLAS_NUM_THREADS=1:
// LibTorch's products go to OpenBLAS, which does not heed torch::set_num_threads.
//   bench_window [--rounds N] [--window W] [--dtype float32|float64|both] [T ...]
//   (defaults: 5 rounds, w = 256, both dtypes, T = 1024 4096)
#include "tapegrad.hpp"
#include "host.hpp"
#include "live_heap.hpp"
#include "timing.hpp"
#include "tools/options.hpp"

#ifdef TAPEGRAD_HAVE_TORCH
#include <torch/torch.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace tapegrad;

constexpr std::size_t H = 8, H_kv = 2, dh = 64;

struct Sizes {
    std::size_t T, window;
};

// The leaves and the seed G, drawn in double (so both dtypes start from one draw): unit-variance
// Q, K (scores of unit variance after 1/√dh) and V.
struct Draw {
    Tensor<double> Q, K, V, G;
};

Draw draw(const Sizes& s) {
    std::mt19937_64 rng(s.T * 7 + s.window);
    std::normal_distribution<double> normal;
    const auto random = [&](const Shape& shape) {
        Tensor<double> t(shape);
        for (double& x : t.data()) x = normal(rng);
        return t;
    };
    return {random({1, H, s.T, dh}), random({1, H_kv, s.T, dh}), random({1, H_kv, s.T, dh}), random({1, H, s.T, dh})};
}

// One result of a contender: O and the three gradients, as double for the comparison.
struct Result {
    Tensor<double> O, dQ, dK, dV;
};

template <class T>
class TapegradContender {
public:
    TapegradContender(const Draw& d, const Sizes& s)
        : Q_(tensor_cast<T>(d.Q)), K_(tensor_cast<T>(d.K)), V_(tensor_cast<T>(d.V)), G_(tensor_cast<T>(d.G)), s_(s) {}

    void run(Tape<T>& tape) const {
        tape.clear();
        const Var<T> Q = tape.leaf(Q_), K = tape.leaf(K_), V = tape.leaf(V_);
        const Var<T> O = fused_attention(Q, repeat_heads(K, H / H_kv), repeat_heads(V, H / H_kv),
                                         {.pattern = {.causal = true, .window = s_.window, .alibi_heads = H}});
        tape.backward(O, G_);
        if (keep_ != nullptr) *keep_ = {tensor_cast<double>(O.value()), tensor_cast<double>(Q.grad()),
                                        tensor_cast<double>(K.grad()), tensor_cast<double>(V.grad())};
    }
    Result result() {
        Result r;
        keep_ = &r;
        Tape<T> tape;
        run(tape);
        keep_ = nullptr;
        return r;
    }

private:
    Tensor<T> Q_, K_, V_, G_;
    Sizes s_;
    Result* keep_ = nullptr;
};

#ifdef TAPEGRAD_HAVE_TORCH
template <class T>
torch::Tensor to_torch(const Tensor<T>& t) {
    std::vector<long> shape;
    for (std::size_t k = 0; k < t.shape().rank(); ++k) shape.push_back(static_cast<long>(t.shape()[k]));
    const auto type = std::is_same_v<T, float> ? torch::kFloat : torch::kDouble;
    return torch::from_blob(const_cast<T*>(t.data().data()), shape, type).clone();
}

Tensor<double> from_torch(const torch::Tensor& t) {
    const torch::Tensor d = t.detach().to(torch::kDouble).contiguous();
    std::vector<std::size_t> dims;
    for (const long n : d.sizes()) dims.push_back(static_cast<std::size_t>(n));
    Tensor<double> out{Shape(dims)};
    std::copy(d.data_ptr<double>(), d.data_ptr<double>() + d.numel(), out.data().begin());
    return out;
}

enum class TorchPath { composed, sdpa };

template <class T>
class TorchContender {
public:
    TorchContender(const Draw& d, const Sizes& s, TorchPath path)
        : Q_(to_torch(tensor_cast<T>(d.Q))), K_(to_torch(tensor_cast<T>(d.K))), V_(to_torch(tensor_cast<T>(d.V))),
          G_(to_torch(tensor_cast<T>(d.G))), B_(bias(s)), path_(path) {}

    Result run() const {
        const torch::Tensor Q = Q_.clone().set_requires_grad(true), K = K_.clone().set_requires_grad(true),
                            V = V_.clone().set_requires_grad(true);
        const torch::Tensor K_g = K.repeat_interleave(H / H_kv, 1), V_g = V.repeat_interleave(H / H_kv, 1);
        torch::Tensor O;
        if (path_ == TorchPath::sdpa) {
            O = std::get<0>(at::_scaled_dot_product_attention(Q, K_g, V_g, B_));
        } else {
            const torch::Tensor S = Q.matmul(K_g.transpose(-2, -1)) / std::sqrt(double(dh)) + B_;
            O = torch::softmax(S, -1).matmul(V_g);
        }
        O.backward(G_);
        return {from_torch(O), from_torch(Q.grad()), from_torch(K.grad()), from_torch(V.grad())};
    }
    void run_only() const { (void)run(); }

private:
    // B [H, T, T]: ALiBi's −m_h·|i − j| (ops/alibi.hpp's slopes and entries, in double, then T)
    // where i − w < j <= i, −inf elsewhere.
    static torch::Tensor bias(const Sizes& s) {
        const std::vector<double> slopes = alibi_slopes(H);
        Tensor<T> B(Shape{H, s.T, s.T}, -std::numeric_limits<T>::infinity());
        for (std::size_t h = 0; h < H; ++h)
            for (std::size_t i = 0; i < s.T; ++i)
                for (std::size_t j = i + 1 > s.window ? i + 1 - s.window : 0; j <= i; ++j)
                    B[(h * s.T + i) * s.T + j] = static_cast<T>(alibi_entry(slopes[h], i, j));
        return to_torch(B);
    }
    torch::Tensor Q_, K_, V_, G_, B_;
    TorchPath path_;
};
#endif

// max |a − b| over max |b|: the error relative to the tensor's scale.
double relative_gap(const Tensor<double>& a, const Tensor<double>& b) {
    double gap = 0, scale = 0;
    for (std::size_t k = 0; k < b.size(); ++k) {
        gap = std::max(gap, std::abs(a[k] - b[k]));
        scale = std::max(scale, std::abs(b[k]));
    }
    return gap / std::max(scale, std::numeric_limits<double>::min());
}

[[maybe_unused]] double worst_gap(const Result& a, const Result& b) {  // (used only against LibTorch)
    return std::max({relative_gap(a.O, b.O), relative_gap(a.dQ, b.dQ), relative_gap(a.dK, b.dK),
                     relative_gap(a.dV, b.dV)});
}

// The heap `work` holds at its peak beyond what was live before it, in MiB, run on a new thread
// (whose pool of dead tapes' buffers is empty, so a tape's own allocations are counted).
double peak_mib(const std::function<void()>& work) {
    double mib = 0;
    std::thread([&] {
        const long long before = heap::live.load();
        heap::peak = before;
        work();
        mib = double(heap::peak.load() - before) / (1024.0 * 1024.0);
    }).join();
    return mib;
}

template <class T>
void compare(const Sizes& s, std::size_t rounds) {
    const std::string_view dtype = std::is_same_v<T, float> ? "float32" : "float64";
    [[maybe_unused]] const double tolerance = std::is_same_v<T, float> ? 1e-3 : 1e-10;  // (against LibTorch)
    const Draw d = draw(s);
    TapegradContender<T> ours(d, s);
    std::vector<std::string> names{"tapegrad"};
    std::vector<std::function<void()>> work;
    Tape<T> tape;
    work.push_back([&] { ours.run(tape); });
    std::vector<double> peaks{peak_mib([&] {
        Tape<T> fresh;
        ours.run(fresh);
    })};
#ifdef TAPEGRAD_HAVE_TORCH
    const Result reference = ours.result();
    std::vector<TorchContender<T>> theirs;
    for (const TorchPath path : {TorchPath::composed, TorchPath::sdpa}) theirs.emplace_back(d, s, path);
    for (std::size_t k = 0; k < theirs.size(); ++k) {
        names.push_back(k == 0 ? "composed" : "sdpa");
        const double gap = worst_gap(theirs[k].run(), reference);
        if (gap > tolerance) {
            fmt::print("WARNING: {} differs from tapegrad by {:.3g} (relative) in {}: not one computation\n",
                       names.back(), gap, dtype);
        }
        peaks.push_back(peak_mib([&] { theirs[k].run_only(); }));
        work.push_back([&theirs, k] { theirs[k].run_only(); });
    }
#endif
    const std::vector<timing::Timing> times = timing::alternate_timings(work, rounds, 0.0);
    double fastest_torch = std::numeric_limits<double>::infinity();
    for (std::size_t k = 1; k < times.size(); ++k) fastest_torch = std::min(fastest_torch, times[k].median_us);
    for (std::size_t k = 0; k < times.size(); ++k) {
        std::string line = fmt::format("window T={} H={} H_kv={} dh={} w={} dtype={} contender={} best_ms={:.1f} "
                                       "median_ms={:.1f} peak_mib={:.1f}",
                                       s.T, H, H_kv, dh, s.window, dtype, names[k], times[k].best_us / 1e3,
                                       times[k].median_us / 1e3, peaks[k]);
        if (k == 0 && times.size() > 1) line += fmt::format(" ratio={:.2f}", fastest_torch / times[0].median_us);
        fmt::print("{}\n", line);
    }
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    timing::keep_freed_memory();  // before any contender allocates (timing.hpp says why)
    std::size_t rounds = 5, window = 256;
    std::string dtype = "both";
    std::vector<std::size_t> sizes;
    try {
        for (int a = 1; a < argc; ++a) {
            const std::string arg = argv[a];
            const auto value = [&] {
                if (a + 1 == argc) throw cli::usage_error(fmt::format("{} needs a value", arg));
                return std::string(argv[++a]);
            };
            if (arg == "--rounds") {
                rounds = cli::integer_argument("--rounds", value(), std::size_t{1}, std::size_t{1000});
            } else if (arg == "--window") {
                window = cli::integer_argument("--window", value(), std::size_t{1}, std::size_t{1} << 20);
            } else if (arg == "--dtype") {
                dtype = value();
                if (dtype != "float32" && dtype != "float64" && dtype != "both")
                    throw cli::usage_error(fmt::format("--dtype is float32, float64 or both, not '{}'", dtype));
            } else {
                sizes.push_back(cli::integer_argument("a size T", arg, std::size_t{1}, std::size_t{1} << 16));
            }
        }
    } catch (const cli::usage_error& e) {
        fmt::print(stderr, "bench_window: {} (usage: bench_window [--rounds N] [--window W] "
                           "[--dtype float32|float64|both] [T]...)\n", e.what());
        return cli::exit_usage;
    }
    if (sizes.empty()) sizes = {1024, 4096};
    set_threads(1);
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(1);
#endif
    timing::print_host_line();
    fmt::print("# grouped-query attention, causal sliding window + ALiBi, forward + backward, one thread, "
               "median of {} rounds; ratio = the faster LibTorch path's median time over tapegrad's\n", rounds);
    for (const std::size_t T : sizes) {
        if (dtype != "float64") compare<float>({T, window}, rounds);
        if (dtype != "float32") compare<double>({T, window}, rounds);
    }
}
