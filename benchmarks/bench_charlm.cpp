// bench_charlm: training throughput (tokens per second, one thread) of the character-level
// language model of models/charlm.hpp at the example's default size, tapegrad against the same
// model written in LibTorch C++ (the engines compared, not Python): each side runs complete
// training steps (forward, backward, global-norm clipping, AdamW with the warm-up + cosine rate)
// from the same initial parameters on the same batches. In float64, tapegrad runs twice, with each
// attention kernel (fused, the example's default, and composed), against LibTorch in float64; in
// float32, tapegrad's float trainer (BasicCharLmTrainer<float>: float32 parameters, gradients and
// Adam moments; fused kernel) against LibTorch in float32, both from the float64 initial
// parameters rounded to float32. All five contenders alternate, round by round, on this thread's
// CPU clock; the lines give the median and the best round:
//   charlm L=… D=… T=… tapegrad_tokens_per_s=… libtorch_tokens_per_s=… ratio=… kernel=fused|composed
//     statistic=median|best|overall dtype=float64|float32
// (overall: all rounds' tokens over all rounds' time, the throughput of the whole run)
// (ratio = tapegrad's tokens/s over LibTorch's in the same dtype). On a machine with two or more
// cores, the last lines time the float32 step on two threads against one (bench_two_threads).
// Before timing, the first steps' losses of every side are compared with LibTorch's in the same
// dtype: they must agree to 1e-9 (relative) in float64 and to 1e-5 in float32 (float32 gradients
// differ in their last bits between two engines that sum in different orders, and Adam's m/√v
// turns such a difference in a gradient entry near zero into a step of up to ±lr; measured
// 5.2e-7 on this machine), or the line is not a comparison of the same computation and a WARNING
// says so.
//   bench_charlm [--rounds N] [--steps-per-round N] [--per-round]
// (--rounds: default 41, a smaller N for a quick smoke run; --steps-per-round: default 2;
// --per-round: a line per round and contender with its rate, each step's milliseconds, the minor
// page faults it took and its wall time over its CPU time: where slow rounds come from)
// LibTorch's matrix products use the system's libblas.so.3: on a machine where it is Debian's
// reference BLAS (libblas3) rather than OpenBLAS (libopenblas0-pthread), LibTorch's GEMMs run
// several times slower; the libtorch_gemm lines report the rate it gets in each dtype, the
// tapegrad_gemm lines ours at the same shape, and the environment line names the host's CPU.
// The corpus is Debian's `fortunes` text when installed; otherwise a seeded random text over 96
// characters stands in (the throughput depends on the sizes only, not on the text).
#include "models/charlm.hpp"
#include "tapegrad.hpp"
#include "host.hpp"
#include "timing.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#ifdef TAPEGRAD_HAVE_TORCH
#include <torch/torch.h>
#endif

using namespace tapegrad;

namespace {

using timing::median;
using timing::thread_seconds;

Corpus benchmark_corpus() {
    const std::vector<std::filesystem::path> files = default_corpus_files();
    if (std::all_of(files.begin(), files.end(), [](const auto& f) { return std::filesystem::exists(f); })) {
        return load_corpus(files);
    }
    fmt::print("note: the fortunes corpus is not installed; a random text stands in\n");
    Corpus corpus;
    for (char c = ' '; c <= '~'; ++c) corpus.alphabet += c;
    corpus.alphabet += '\n';
    std::sort(corpus.alphabet.begin(), corpus.alphabet.end());
    std::mt19937_64 generator(5);
    for (std::size_t k = 0; k < 200'000; ++k) corpus.train.push_back(generator() % corpus.alphabet.size());
    corpus.validation = corpus.train;
    return corpus;
}

#ifdef TAPEGRAD_HAVE_TORCH
template <class T>
constexpr torch::ScalarType torch_type() {
    return std::is_same_v<T, float> ? torch::kFloat : torch::kDouble;
}

template <class T>
torch::Tensor to_torch(const Tensor<T>& t) {
    std::vector<long> sizes;
    for (std::size_t axis = 0; axis < t.rank(); ++axis) sizes.push_back(static_cast<long>(t.shape()[axis]));
    return torch::from_blob(const_cast<T*>(t.data().data()), sizes, torch_type<T>()).clone();
}

torch::Tensor token_tensor(const std::vector<std::size_t>& tokens, std::size_t B) {
    std::vector<long> values(tokens.begin(), tokens.end());
    return torch::tensor(values, torch::kLong).view({static_cast<long>(B), -1});
}

// The model of models/transformer.hpp in LibTorch: the same parameters in the same layout (rows
// projected as X·W), pre-norm blocks, causal multi-head attention scaled by 1/√dh, GELU (tanh),
// tied output projection, mean cross-entropy. AdamW (decay on matrices only, as DecayScope::
// matrices) and clip_grad_norm_ are LibTorch's own. The dtype is the initial parameters' (double
// or float); LibTorch computes in it throughout, its optimizer's scalars in double as PyTorch's.
class TorchCharLm {
public:
    template <class T>
    TorchCharLm(const std::vector<Tensor<T>>& initial, const TransformerConfig& c, const CharLmSettings& s)
        : config_(c), settings_(s), optimizer_(make_parameters(initial), adamw_options(s)) {}

    double step(const CharBatch& batch, double rate) {
        optimizer_.zero_grad();
        const torch::Tensor loss = forward(batch);
        loss.backward();
        torch::nn::utils::clip_grad_norm_(parameters_, settings_.clip_norm);
        for (auto& group : optimizer_.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(rate);
        optimizer_.step();
        return loss.item<double>();
    }

private:
    template <class T>
    std::vector<torch::optim::OptimizerParamGroup> make_parameters(const std::vector<Tensor<T>>& initial) {
        std::vector<torch::Tensor> matrices, vectors;
        for (const Tensor<T>& t : initial) {
            parameters_.push_back(to_torch(t).requires_grad_(true));
            (t.rank() >= 2 ? matrices : vectors).push_back(parameters_.back());
        }
        std::vector<torch::optim::OptimizerParamGroup> groups;
        groups.emplace_back(matrices);
        groups.emplace_back(vectors, std::make_unique<torch::optim::AdamWOptions>(adamw_options(settings_).weight_decay(0)));
        return groups;
    }

    static torch::optim::AdamWOptions adamw_options(const CharLmSettings& s) {
        const AdamSettings a = s.adam();
        return torch::optim::AdamWOptions(a.learning_rate)
            .betas({a.beta1, a.beta2})
            .eps(a.epsilon)
            .weight_decay(a.weight_decay);
    }

    torch::Tensor layer_norm(const torch::Tensor& X, std::size_t gain) const {
        return torch::layer_norm(X, {static_cast<long>(config_.width)}, parameters_[gain], parameters_[gain + 1],
                                 config_.layer_norm.epsilon);
    }

    torch::Tensor attention(const torch::Tensor& a, std::size_t first) const {
        const long B = a.size(0), T = a.size(1), H = static_cast<long>(config_.heads), dh = a.size(2) / H;
        const auto heads = [&](const torch::Tensor& W) { return a.matmul(W).view({B, T, H, dh}).transpose(1, 2); };
        const torch::Tensor Q = heads(parameters_[first]), K = heads(parameters_[first + 1]),
                            V = heads(parameters_[first + 2]);
        const torch::Tensor hidden = torch::ones({T, T}, torch::kBool).triu(1);  // key after query
        const torch::Tensor S = Q.matmul(K.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
        const torch::Tensor A = torch::softmax(S.masked_fill(hidden, -std::numeric_limits<double>::infinity()), -1);
        return A.matmul(V).transpose(1, 2).reshape({B, T, H * dh}).matmul(parameters_[first + 3]);
    }

    torch::Tensor forward(const CharBatch& batch) const {
        const torch::Tensor tokens = token_tensor(batch.tokens, batch.size);
        const long T = tokens.size(1);
        const torch::Tensor& E = parameters_[0];
        torch::Tensor X = E.index_select(0, tokens.flatten()).view({tokens.size(0), T, -1}) +
                          parameters_[1].slice(0, 0, T);
        for (std::size_t l = 0; l < config_.layers; ++l) {
            const std::size_t b = 2 + 12 * l;  // ln1 gain, bias, W_Q, W_K, W_V, W_O, ln2 gain, bias, W_1, b_1, W_2, b_2
            X = X + attention(layer_norm(X, b), b + 2);
            const torch::Tensor hidden =
                torch::gelu(layer_norm(X, b + 6).matmul(parameters_[b + 8]) + parameters_[b + 9], "tanh");
            X = X + hidden.matmul(parameters_[b + 10]) + parameters_[b + 11];
        }
        const torch::Tensor logits = layer_norm(X, parameters_.size() - 2).matmul(E.t());
        return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}),
                                                    token_tensor(batch.targets, batch.size).flatten());
    }

    TransformerConfig config_;
    CharLmSettings settings_;
    std::vector<torch::Tensor> parameters_;
    torch::optim::AdamW optimizer_;
};
#endif

// One tapegrad side per attention kernel and scalar type, from the same initial parameters (a
// trainer owns its tape, which does not move: the sides are built in place).
template <class T>
struct Side {
    Side(const CharLmSettings& settings, AttentionKernel k, const Corpus& corpus)
        : kernel(k), trainer(with_kernel(settings, k), corpus) {}
    static CharLmSettings with_kernel(CharLmSettings settings, AttentionKernel k) {
        settings.kernel = k;
        return settings;
    }
    AttentionKernel kernel;
    BasicCharLmTrainer<T> trainer;
    std::vector<double> rates;
};

// The highest rate of a contender's rounds (0 when it ran none: no LibTorch).
double best_of(const std::vector<double>& rates) {
    return rates.empty() ? 0.0 : *std::max_element(rates.begin(), rates.end());
}

// The median, best and overall lines of one tapegrad side against LibTorch's rates in the same
// dtype (none without LibTorch). Every round times the same tokens, so all rounds' tokens over all
// rounds' time (the run's throughput) is the harmonic mean of the rates.
template <class T>
void print_lines(const Side<T>& side, const std::vector<double>& theirs, const TransformerConfig& c) {
    const auto overall = [](const std::vector<double>& v) {
        double seconds_per_token = 0;
        for (const double rate : v) seconds_per_token += 1.0 / rate;
        return v.empty() ? 0.0 : static_cast<double>(v.size()) / seconds_per_token;
    };
    const auto line = [&](const char* statistic, double ours_rate, double theirs_rate) {
        const std::string theirs_figures =
            theirs.empty() ? std::string("libtorch_tokens_per_s=NA ratio=NA")
                           : fmt::format("libtorch_tokens_per_s={:.0f} ratio={:.3f}", theirs_rate, ours_rate / theirs_rate);
        fmt::print("charlm L={} D={} T={} tapegrad_tokens_per_s={:.0f} {} kernel={} statistic={} dtype={}\n", c.layers,
                   c.width, c.context, ours_rate, theirs_figures, attention_kernel_name(side.kernel), statistic,
                   dtype_name<T>());
    };
    line("median", median(side.rates), theirs.empty() ? 0.0 : median(theirs));
    line("best", best_of(side.rates), best_of(theirs));
    line("overall", overall(side.rates), overall(theirs));
}

#ifdef TAPEGRAD_HAVE_TORCH
// LibTorch's GEMMs go to whatever libblas.so.3 the system selects (Debian's LibTorch is built with
// BLAS_INFO=generic): the reference BLAS unless OpenBLAS provides it. The rate of one warm GEMM of
// the MLP's shape (tokens × D times D × 4D) shows which, since it dominates LibTorch's step.
void print_libtorch_gemm_rate(long tokens, long width, torch::ScalarType type) {
    const torch::Tensor a = torch::rand({tokens, width}, type), b = torch::rand({width, 4 * width}, type);
    for (int round = 0; round < 3; ++round) (void)a.mm(b);  // warm-up: BLAS start-up, first page faults
    std::vector<double> samples;
    for (int round = 0; round < 21; ++round) {
        const double start = thread_seconds();
        const torch::Tensor product = a.mm(b);
        samples.push_back(thread_seconds() - start);
    }
    fmt::print("libtorch_gemm m={} k={} n={} gflops={:.1f} dtype={}\n", a.size(0), a.size(1), b.size(1),
               2.0 * static_cast<double>(a.numel() * b.size(1)) / median(samples) / 1e9,
               type == torch::kFloat ? "float32" : "float64");
}
#endif

// The rate our compiled GEMM (the kernel every product of the step uses) reaches on one thread at
// the MLP's shape (tokens × D times D × 4D), beside LibTorch's (OpenBLAS's) line above: the
// fraction of this host's GEMM rate the products run at.
template <std::floating_point T>
void print_tapegrad_gemm_rate(std::size_t tokens, std::size_t width) {
    std::mt19937_64 generator(7);
    std::uniform_real_distribution<double> uniform(-1, 1);
    const std::size_t m = tokens, k = width, n = 4 * width;
    std::vector<T> a(m * k), b(k * n), c(m * n);
    for (T& x : a) x = static_cast<T>(uniform(generator));
    for (T& x : b) x = static_cast<T>(uniform(generator));
    for (int round = 0; round < 3; ++round) kernels::gemm(kernels::Form::ab, m, n, k, a.data(), b.data(), c.data(), false);
    std::vector<double> samples;
    for (int round = 0; round < 21; ++round) {
        const double start = thread_seconds();
        kernels::gemm(kernels::Form::ab, m, n, k, a.data(), b.data(), c.data(), false);
        samples.push_back(thread_seconds() - start);
    }
    fmt::print("tapegrad_gemm m={} k={} n={} gflops={:.1f} dtype={}\n", m, k, n,
               2.0 * static_cast<double>(m * k * n) / median(samples) / 1e9, std::is_same_v<T, float> ? "float32" : "float64");
}

// Two threads against one on the float32 step. Two threads need the batch in two micro-batches
// (two tapes, so each thread has a whole half to run; one batch on one tape leaves them only the
// ops, too small at this size to split), so three trainers from the same start alternate rounds on
// the wall clock: the batch on one tape and one thread (the fastest one-thread step), two
// micro-batches on one thread (the same computation as on two) and on two threads. Results do not
// depend on the threads: the last two trainers' parameters must be equal to the bit at the end, or
// a WARNING says so.
void bench_two_threads(const CharLmSettings& defaults, const Corpus& corpus, std::size_t rounds,
                       std::size_t steps_per_round) {
    CharLmSettings halves = defaults;
    halves.micro_batches = 2;
    BasicCharLmTrainer<float> whole(defaults, corpus), one(halves, corpus), two(halves, corpus);
    const double tokens = static_cast<double>(defaults.batch * defaults.context * steps_per_round);
    std::vector<double> whole_rates, one_rates, two_rates;
    const auto rate = [&](BasicCharLmTrainer<float>& trainer, unsigned threads) {
        set_threads(threads);
        const double start = timing::wall_seconds();
        for (std::size_t s = 0; s < steps_per_round; ++s) trainer.step();
        return tokens / (timing::wall_seconds() - start);
    };
    for (std::size_t round = 0; round < rounds; ++round) {
        whole_rates.push_back(rate(whole, 1));
        one_rates.push_back(rate(one, 1));
        two_rates.push_back(rate(two, 2));
    }
    set_threads(1);
    const bool same = one.parameters() == two.parameters();  // shapes and every element
    if (!same) fmt::print("WARNING: the one- and two-thread trainers' parameters differ\n");
    for (const auto& [statistic, of] : {std::pair{"median", +[](const std::vector<double>& v) { return median(v); }},
                                        std::pair{"best", +[](const std::vector<double>& v) { return best_of(v); }}}) {
        fmt::print(
            "charlm_threads dtype=float32 statistic={} one_tape_one_thread_tokens_per_s={:.0f} "
            "two_micro_batches_one_thread_tokens_per_s={:.0f} two_micro_batches_two_threads_tokens_per_s={:.0f} "
            "speedup_same_step={:.3f} speedup_over_one_tape={:.3f} parameters_bitwise_equal={}\n",
            statistic, of(whole_rates), of(one_rates), of(two_rates), of(two_rates) / of(one_rates),
            of(two_rates) / of(whole_rates), same);
    }
}

// The minor page faults this thread has taken so far: a round that maps fresh memory (an allocator
// returning buffers to the system and asking again) pays one per 4 KiB page.
long minor_faults() {
    rusage usage{};
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_minflt;
}

}  // namespace

int main(int argc, char** argv) {
    tapegrad::timing::keep_freed_memory();  // before any contender allocates (timing.hpp says why)
    std::size_t rounds = 41;  // 41: a steady median on a shared machine
    bool per_round = false;
    std::size_t steps_per_round = 2;
    try {  // numbers read the way every program of the project reads them (tools/options.hpp)
        for (int a = 1; a < argc; ++a) {
            const std::string argument = argv[a];
            if (argument == "--per-round") {
                per_round = true;
            } else if (argument == "--steps-per-round" && a + 1 < argc) {
                steps_per_round =
                    cli::integer_argument("--steps-per-round", argv[++a], std::size_t{1}, std::size_t{1000});
            } else if (argument == "--rounds" && a + 1 < argc) {
                rounds = cli::integer_argument("--rounds", argv[++a], std::size_t{1}, std::size_t{100000});
            } else {
                throw cli::usage_error(fmt::format("unknown argument '{}'", argv[a]));
            }
        }
    } catch (const cli::usage_error& e) {
        fmt::print(stderr, "bench_charlm: {} (usage: bench_charlm [--rounds N] [--steps-per-round N] [--per-round])\n",
                   e.what());
        return cli::exit_usage;
    }
    set_threads(1);
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(1);
#endif
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    const char* blas_threads = std::getenv("OPENBLAS_NUM_THREADS");
    fmt::print("environment host_cpu=\"{}\" OPENBLAS_CORETYPE={} OPENBLAS_NUM_THREADS={} cpu={}\n", timing::cpu_model(),
               coretype ? coretype : "unset", blas_threads ? blas_threads : "unset", cpu_level_name(cpu_level()));

    timing::print_host_line();
    const CharLmSettings settings{};  // the example's defaults
    const Corpus corpus = benchmark_corpus();
    std::deque<Side<double>> ours;
    for (const AttentionKernel kernel : {AttentionKernel::fused, AttentionKernel::composed}) {
        ours.emplace_back(settings, kernel, corpus);
    }
    std::deque<Side<float>> ours_float;  // the example's default kernel
    ours_float.emplace_back(settings, AttentionKernel::fused, corpus);
    const TransformerConfig& c = ours.front().trainer.config();
    const double tokens_per_step = static_cast<double>(settings.batch * settings.context);
    std::vector<double> theirs_rates, theirs_float_rates;

    print_tapegrad_gemm_rate<double>(static_cast<std::size_t>(tokens_per_step), c.width);
    print_tapegrad_gemm_rate<float>(static_cast<std::size_t>(tokens_per_step), c.width);
#ifdef TAPEGRAD_HAVE_TORCH
    print_libtorch_gemm_rate(static_cast<long>(tokens_per_step), static_cast<long>(c.width), torch::kDouble);
    print_libtorch_gemm_rate(static_cast<long>(tokens_per_step), static_cast<long>(c.width), torch::kFloat);
    TorchCharLm theirs(ours.front().trainer.parameters(), c, settings);
    TorchCharLm theirs_float(ours_float.front().trainer.parameters(), c, settings);
    std::size_t their_steps = 0, their_float_steps = 0;
    const auto stepper = [&corpus, &settings](TorchCharLm& model, std::size_t& steps) {
        return [&corpus, &settings, &model, &steps] {
            const double loss = model.step(training_batch(corpus, settings, steps), settings.schedule().rate(steps));
            ++steps;
            return loss;
        };
    };
    const auto their_step = stepper(theirs, their_steps);
    const auto their_float_step = stepper(theirs_float, their_float_steps);
    // Same computation first: the losses of the first steps must agree (all from one start).
    constexpr std::size_t checked_steps = 3;
    const auto agreement = [&](auto& sides, const auto& step, const char* dtype, double tolerance) {
        double worst = 0;
        for (std::size_t s = 0; s < checked_steps; ++s) {
            const double b = step();
            for (auto& side : sides) worst = std::max(worst, std::abs(side.trainer.step() - b) / std::abs(b));
        }
        if (!(worst <= tolerance)) {
            fmt::print("WARNING: the first {} losses differ from LibTorch's by {:.3g} (relative)\n", dtype, worst);
        }
        fmt::print("agreement first_{}_losses_max_relative_difference={:.2e} dtype={}\n", checked_steps, worst, dtype);
    };
    agreement(ours, their_step, "float64", 1e-9);
    agreement(ours_float, their_float_step, "float32", 1e-5);
#endif
    std::size_t round = 0;
    const auto timed_rate = [&](const char* contender, const auto& step) {
        const long faults = minor_faults();
        const double start = thread_seconds(), wall_start = timing::wall_seconds();
        std::vector<double> step_ms;
        for (std::size_t s = 0; s < steps_per_round; ++s) {
            const double step_start = thread_seconds();
            step();
            step_ms.push_back(1e3 * (thread_seconds() - step_start));
        }
        const double seconds = thread_seconds() - start, wall = timing::wall_seconds() - wall_start;
        const double rate = tokens_per_step * static_cast<double>(steps_per_round) / seconds;
        if (per_round) {
            fmt::print(
                "round {} contender={} tokens_per_s={:.0f} step_ms={:.2f} minor_faults={} wall_over_cpu={:.3f}\n",
                round, contender, rate, fmt::join(step_ms, ","), minor_faults() - faults, wall / seconds);
        }
        return rate;
    };
    for (; round < rounds; ++round) {
        for (Side<double>& side : ours) {
            const std::string name = fmt::format("tapegrad_float64_{}", attention_kernel_name(side.kernel));
            side.rates.push_back(timed_rate(name.c_str(), [&] { side.trainer.step(); }));
        }
#ifdef TAPEGRAD_HAVE_TORCH
        theirs_rates.push_back(timed_rate("libtorch_float64", their_step));
#endif
        for (Side<float>& side : ours_float) {
            side.rates.push_back(timed_rate("tapegrad_float32_fused", [&] { side.trainer.step(); }));
        }
#ifdef TAPEGRAD_HAVE_TORCH
        theirs_float_rates.push_back(timed_rate("libtorch_float32", their_float_step));
#endif
    }
    for (const Side<double>& side : ours) print_lines(side, theirs_rates, c);
    for (const Side<float>& side : ours_float) print_lines(side, theirs_float_rates, c);
    if (std::thread::hardware_concurrency() > 1) bench_two_threads(settings, corpus, rounds, steps_per_round);
    fmt::print("sizes B={} H={} V={} steps_per_round={} rounds={}\n", settings.batch, c.heads, c.vocabulary,
               steps_per_round, rounds);
    return 0;
}
