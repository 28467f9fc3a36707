// What the training-step benchmarks (bench_charlm, bench_llama) share: the corpus they draw their
// batches from, the environment and GEMM-rate lines, the rounds in which the contenders alternate
// (each timed on this thread's CPU clock) and the statistics and ratio lines printed from them, the
// check that every side's first losses agree with LibTorch's, and LibTorch's side of a training
// step (tapegrad's initial parameters copied, AdamW with decay on matrices only, global-norm
// clipping, the schedule's rate set each step). Each program keeps only its model.
#pragma once

#include "models/charlm.hpp"
#include "timing.hpp"

#include "autodiff/cpu.hpp"
#include "autodiff/kernels.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#ifdef TAPEGRAD_HAVE_TORCH
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#endif

namespace tapegrad::bench {

// Debian's `fortunes` text when installed; otherwise a seeded random text over 96 characters stands
// in (the throughput depends on the sizes only, not on the text).
inline Corpus benchmark_corpus() {
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

// The line a measurement is read with: the host's CPU, the settings that decide LibTorch's BLAS
// kernels and threads, and the level tapegrad's kernels run at.
inline void print_environment_line() {
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    const char* blas_threads = std::getenv("OPENBLAS_NUM_THREADS");
    fmt::print("environment host_cpu=\"{}\" OPENBLAS_CORETYPE={} OPENBLAS_NUM_THREADS={} cpu={}\n", timing::cpu_model(),
               coretype ? coretype : "unset", blas_threads ? blas_threads : "unset", cpu_level_name(cpu_level()));
}

// The rate our compiled GEMM (the kernel every product of the step uses) reaches on one thread at
// a product of the step (m × k times k × n, the MLP's), beside LibTorch's line below: the fraction
// of this host's GEMM rate the products run at.
template <std::floating_point T>
void print_tapegrad_gemm_rate(std::size_t m, std::size_t k, std::size_t n) {
    std::mt19937_64 generator(7);
    std::uniform_real_distribution<double> uniform(-1, 1);
    std::vector<T> a(m * k), b(k * n), c(m * n);
    for (T& x : a) x = static_cast<T>(uniform(generator));
    for (T& x : b) x = static_cast<T>(uniform(generator));
    for (int round = 0; round < 3; ++round)
        kernels::gemm(kernels::Form::ab, m, n, k, a.data(), b.data(), c.data(), false);
    std::vector<double> samples;
    for (int round = 0; round < 21; ++round) {
        const double start = timing::thread_seconds();
        kernels::gemm(kernels::Form::ab, m, n, k, a.data(), b.data(), c.data(), false);
        samples.push_back(timing::thread_seconds() - start);
    }
    fmt::print("tapegrad_gemm m={} k={} n={} gflops={:.1f} dtype={}\n", m, k, n,
               2.0 * static_cast<double>(m * k * n) / timing::median(samples) / 1e9, dtype_name<T>());
}

// The highest rate of a contender's rounds (0 when it ran none: no LibTorch).
inline double best_of(const std::vector<double>& rates) {
    return rates.empty() ? 0.0 : *std::max_element(rates.begin(), rates.end());
}

// All rounds' tokens over all rounds' time, the throughput of the whole run: every round times the
// same tokens, so it is the harmonic mean of the rates (0 when there are none).
inline double overall(const std::vector<double>& rates) {
    double seconds_per_token = 0;
    for (const double rate : rates) seconds_per_token += 1.0 / rate;
    return rates.empty() ? 0.0 : static_cast<double>(rates.size()) / seconds_per_token;
}

// The median, best and overall lines of one tapegrad contender against LibTorch's rates in the same
// dtype (none without LibTorch); `model` opens each line ("charlm L=2 D=64 T=64"):
//   <model> tapegrad_tokens_per_s=… libtorch_tokens_per_s=… ratio=… kernel=… statistic=… dtype=…
inline void print_ratio_lines(std::string_view model, const std::vector<double>& ours,
                              const std::vector<double>& theirs, std::string_view kernel, std::string_view dtype) {
    const auto line = [&](const char* statistic, double ours_rate, double theirs_rate) {
        const std::string theirs_figures = theirs.empty() ? std::string("libtorch_tokens_per_s=NA ratio=NA")
                                                          : fmt::format("libtorch_tokens_per_s={:.0f} ratio={:.3f}",
                                                                        theirs_rate, ours_rate / theirs_rate);
        fmt::print("{} tapegrad_tokens_per_s={:.0f} {} kernel={} statistic={} dtype={}\n", model, ours_rate,
                   theirs_figures, kernel, statistic, dtype);
    };
    line("median", timing::median(ours), theirs.empty() ? 0.0 : timing::median(theirs));
    line("best", best_of(ours), best_of(theirs));
    line("overall", overall(ours), overall(theirs));
}

// Our bfloat16 step against our float32 step (the products' speed-up, the issue's ≥ 1.3× target),
// median and best, with the CPU level whose bfloat16 product ran (vdpbf16ps at avx512_bf16 only):
//   <model> bfloat16_over_float32=… statistic=… cpu=…
inline void print_precision_speedup(std::string_view model, const std::vector<double>& bfloat16,
                                    const std::vector<double>& float32) {
    fmt::print("{} bfloat16_over_float32={:.3f} statistic=median cpu={}\n", model,
               timing::median(bfloat16) / timing::median(float32), cpu_level_name(cpu_level()));
    fmt::print("{} bfloat16_over_float32={:.3f} statistic=best cpu={}\n", model, best_of(bfloat16) / best_of(float32),
               cpu_level_name(cpu_level()));
}

// The minor page faults this thread has taken so far: a round that maps fresh memory (an allocator
// returning buffers to the system and asking again) pays one per 4 KiB page.
inline long minor_faults() {
    rusage usage{};
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_minflt;
}

// One side of the comparison: its name in the per-round lines, one training step, and the rate of
// each round it ran.
struct Contender {
    std::string name;
    std::function<void()> step;
    std::vector<double> rates;
};

struct RoundSettings {
    std::size_t rounds = 41;  // 41: a steady median on a shared machine
    std::size_t steps_per_round = 2;
    double tokens_per_step = 0;
    bool per_round = false;  // a line per round and contender (where slow rounds come from)
};

// The contenders alternate, round by round (so all see the same machine state), each round timing
// steps_per_round steps of one contender on this thread's CPU clock (time spent descheduled on a
// shared machine is nobody's). With per_round, each round's line gives the contender's rate, each
// step's milliseconds, the minor page faults it took and its wall time over its CPU time.
inline void run_rounds(std::vector<Contender>& contenders, const RoundSettings& s) {
    for (std::size_t round = 0; round < s.rounds; ++round) {
        for (Contender& contender : contenders) {
            const long faults = minor_faults();
            const double start = timing::thread_seconds(), wall_start = timing::wall_seconds();
            std::vector<double> step_ms;
            for (std::size_t k = 0; k < s.steps_per_round; ++k) {
                const double step_start = timing::thread_seconds();
                contender.step();
                step_ms.push_back(1e3 * (timing::thread_seconds() - step_start));
            }
            const double seconds = timing::thread_seconds() - start, wall = timing::wall_seconds() - wall_start;
            const double rate = s.tokens_per_step * static_cast<double>(s.steps_per_round) / seconds;
            if (s.per_round) {
                fmt::print(
                    "round {} contender={} tokens_per_s={:.0f} step_ms={:.2f} minor_faults={} wall_over_cpu={:.3f}\n",
                    round, contender.name, rate, fmt::join(step_ms, ","), minor_faults() - faults, wall / seconds);
            }
            contender.rates.push_back(rate);
        }
    }
}

// Tokens per second of `steps` calls of `step` on the wall clock: the rate of a step run on several
// threads, whose other threads' time this thread's CPU clock would not see.
inline double wall_rate(const std::function<void()>& step, std::size_t steps, double tokens_per_step) {
    const double start = timing::wall_seconds();
    for (std::size_t k = 0; k < steps; ++k) step();
    return tokens_per_step * static_cast<double>(steps) / (timing::wall_seconds() - start);
}

// Same computation first: LibTorch's first `steps` losses (all sides from one start, on the same
// batches) against each of ours, relative; a WARNING when the worst is above `tolerance`, then the
// line with the worst difference. Each call of `theirs` and of an element of `ours` takes one step
// and returns its loss.
inline void check_agreement(const std::function<double()>& theirs, const std::vector<std::function<double()>>& ours,
                            std::string_view dtype, double tolerance, std::size_t steps = 3) {
    double worst = 0;
    for (std::size_t s = 0; s < steps; ++s) {
        const double b = theirs();
        for (const auto& step : ours) worst = std::max(worst, std::abs(step() - b) / std::abs(b));
    }
    if (!(worst <= tolerance)) {
        fmt::print("WARNING: the first {} losses differ from LibTorch's by {:.3g} (relative)\n", dtype, worst);
    }
    fmt::print("agreement first_{}_losses_max_relative_difference={:.2e} dtype={}\n", steps, worst, dtype);
}

#ifdef TAPEGRAD_HAVE_TORCH
template <class T>
constexpr torch::ScalarType torch_type() {
    return std::is_same_v<T, float> ? torch::kFloat : torch::kDouble;
}

// A LibTorch copy of a tensor of any rank, in its own scalar type.
template <class T>
torch::Tensor to_torch(const Tensor<T>& t) {
    std::vector<long> sizes;
    for (std::size_t axis = 0; axis < t.rank(); ++axis) sizes.push_back(static_cast<long>(t.shape()[axis]));
    return torch::from_blob(const_cast<T*>(t.data().data()), sizes, torch_type<T>()).clone();
}

// B sequences of tokens (sequence-major) as a [B, T] index tensor.
inline torch::Tensor token_tensor(const std::vector<std::size_t>& tokens, std::size_t B) {
    std::vector<long> values(tokens.begin(), tokens.end());
    return torch::tensor(values, torch::kLong).view({static_cast<long>(B), -1});
}

// LibTorch's GEMMs go to whatever libblas.so.3 the system selects (Debian's LibTorch is built with
// BLAS_INFO=generic): the reference BLAS unless OpenBLAS provides it. The rate of one warm GEMM of a
// product of the step (the MLP's) shows which, since such products dominate LibTorch's step.
inline void print_libtorch_gemm_rate(long m, long k, long n, torch::ScalarType type) {
    const torch::Tensor a = torch::rand({m, k}, type), b = torch::rand({k, n}, type);
    for (int round = 0; round < 3; ++round) (void)a.mm(b);  // warm-up: BLAS start-up, first page faults
    std::vector<double> samples;
    for (int round = 0; round < 21; ++round) {
        const double start = timing::thread_seconds();
        const torch::Tensor product = a.mm(b);
        samples.push_back(timing::thread_seconds() - start);
    }
    fmt::print("libtorch_gemm m={} k={} n={} gflops={:.1f} dtype={}\n", m, k, n,
               2.0 * static_cast<double>(m * k * n) / timing::median(samples) / 1e9,
               type == torch::kFloat ? "float32" : "float64");
}

// LibTorch's side of a training step, whatever the model: the parameters (copies of tapegrad's
// initial ones, in their dtype), AdamW with weight decay on matrices only (as DecayScope::matrices:
// rank >= 2) and clip_grad_norm_, both LibTorch's own, its scalars in double as PyTorch's. The model
// gives the loss of a batch from parameters().
class TorchTraining {
public:
    template <class T>
    TorchTraining(const std::vector<Tensor<T>>& initial, const CharLmSettings& s)
        : settings_(s), optimizer_(make_parameters(initial), adamw_options(s)) {}

    const std::vector<torch::Tensor>& parameters() const { return parameters_; }

    // One step at learning rate `rate`: gradients zeroed, the loss forward() records, its backward,
    // clipping, AdamW. Returns the loss before the step. With settings.products bfloat16, the
    // forward runs under torch.autocast("cpu", dtype=torch.bfloat16) and the backward outside it,
    // as PyTorch's documentation writes a mixed-precision step (float32 parameters: autocast casts
    // what its lower-precision ops read, and caches the weights' casts until the region ends).
    double step(const std::function<torch::Tensor()>& forward, double rate) {
        optimizer_.zero_grad();
        const torch::Tensor loss = settings_.products == ProductPrecision::bfloat16 ? autocast(forward) : forward();
        loss.backward();
        torch::nn::utils::clip_grad_norm_(parameters_, settings_.clip_norm);
        for (auto& group : optimizer_.param_groups())
            static_cast<torch::optim::AdamWOptions&>(group.options()).lr(rate);
        optimizer_.step();
        return loss.item<double>();
    }

private:
    // forward() in an autocast region to bfloat16 (the C++ of `with torch.autocast("cpu",
    // dtype=torch.bfloat16):`, LibTorch 1.13's at::autocast), its cast cache cleared at the end.
    static torch::Tensor autocast(const std::function<torch::Tensor()>& forward) {
        struct Region {
            Region() {
                at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
                at::autocast::set_cpu_enabled(true);
                at::autocast::increment_nesting();
            }
            ~Region() {
                if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
                at::autocast::set_cpu_enabled(false);
            }
        } region;
        return forward();
    }

    template <class T>
    std::vector<torch::optim::OptimizerParamGroup> make_parameters(const std::vector<Tensor<T>>& initial) {
        std::vector<torch::Tensor> matrices, vectors;
        for (const Tensor<T>& t : initial) {
            parameters_.push_back(to_torch(t).requires_grad_(true));
            (t.rank() >= 2 ? matrices : vectors).push_back(parameters_.back());
        }
        std::vector<torch::optim::OptimizerParamGroup> groups;
        groups.emplace_back(matrices);
        groups.emplace_back(vectors,
                            std::make_unique<torch::optim::AdamWOptions>(adamw_options(settings_).weight_decay(0)));
        return groups;
    }

    static torch::optim::AdamWOptions adamw_options(const CharLmSettings& s) {
        const AdamSettings a = s.adam();
        return torch::optim::AdamWOptions(a.learning_rate)
            .betas({a.beta1, a.beta2})
            .eps(a.epsilon)
            .weight_decay(a.weight_decay);
    }

    CharLmSettings settings_;
    std::vector<torch::Tensor> parameters_;  // before optimizer_, which make_parameters fills it for
    torch::optim::AdamW optimizer_;
};
#endif

}  // namespace tapegrad::bench
