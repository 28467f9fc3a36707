// bench_charlm: training throughput (tokens per second, one thread, double) of the character-level
// language model of examples/charlm.hpp at the example's default size, tapegrad against the same
// model written in LibTorch C++ (the engines compared, not Python): each side runs complete
// training steps (forward, backward, global-norm clipping, AdamW with the warm-up + cosine rate)
// from the same initial parameters on the same batches. tapegrad runs twice, with each attention
// kernel (fused, the example's default, and composed); the three alternate, round by round, on
// this thread's CPU clock; the lines give the median and the best round:
//   charlm L=… D=… T=… tapegrad_tokens_per_s=… libtorch_tokens_per_s=… ratio=… kernel=fused|composed
//     statistic=median|best|overall
// (overall: all rounds' tokens over all rounds' time, the throughput of the whole run)
// (ratio = tapegrad's tokens/s over LibTorch's). Before timing, the first steps' losses of every
// side are compared: they must agree to 1e-9 (relative), or the line is not a comparison of the
// same computation and a WARNING says so.
// LibTorch's matrix products use the system's libblas.so.3: on a machine where it is Debian's
// reference BLAS (libblas3) rather than OpenBLAS (libopenblas0-pthread), LibTorch's GEMMs run
// several times slower; the libtorch_gemm line reports the rate it gets.
// The corpus is Debian's `fortunes` text when installed; otherwise a seeded random text over 96
// characters stands in (the throughput depends on the sizes only, not on the text).
#include "examples/charlm.hpp"
#include "tapegrad.hpp"
#include "timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <random>
#include <string>
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
torch::Tensor to_torch(const Tensor<double>& t) {
    std::vector<long> sizes;
    for (std::size_t axis = 0; axis < t.rank(); ++axis) sizes.push_back(static_cast<long>(t.shape()[axis]));
    return torch::from_blob(const_cast<double*>(t.data().data()), sizes, torch::kDouble).clone();
}

torch::Tensor token_tensor(const std::vector<std::size_t>& tokens, std::size_t B) {
    std::vector<long> values(tokens.begin(), tokens.end());
    return torch::tensor(values, torch::kLong).view({static_cast<long>(B), -1});
}

// The model of models/transformer.hpp in LibTorch: the same parameters in the same layout (rows
// projected as X·W), pre-norm blocks, causal multi-head attention scaled by 1/√dh, GELU (tanh),
// tied output projection, mean cross-entropy. AdamW (decay on matrices only, as DecayScope::
// matrices) and clip_grad_norm_ are LibTorch's own.
class TorchCharLm {
public:
    TorchCharLm(const std::vector<Tensor<double>>& initial, const TransformerConfig& c, const CharLmSettings& s)
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
    std::vector<torch::optim::OptimizerParamGroup> make_parameters(const std::vector<Tensor<double>>& initial) {
        std::vector<torch::Tensor> matrices, vectors;
        for (const Tensor<double>& t : initial) {
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

// One tapegrad side per attention kernel, from the same initial parameters (a trainer owns its
// tape, which does not move: the sides are built in place).
struct Side {
    Side(const CharLmSettings& settings, AttentionKernel k, const Corpus& corpus)
        : kernel(k), trainer(with_kernel(settings, k), corpus) {}
    static CharLmSettings with_kernel(CharLmSettings settings, AttentionKernel k) {
        settings.kernel = k;
        return settings;
    }
    AttentionKernel kernel;
    CharLmTrainer trainer;
    std::vector<double> rates;
};

// The median, best and overall lines of one tapegrad side against LibTorch's rates (none without
// LibTorch). Every round times the same tokens, so all rounds' tokens over all rounds' time (the
// run's throughput) is the harmonic mean of the rates.
void print_lines(const Side& side, const std::vector<double>& theirs, const TransformerConfig& c) {
    const auto best = [](const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); };
    const auto overall = [](const std::vector<double>& v) {
        double seconds_per_token = 0;
        for (const double rate : v) seconds_per_token += 1.0 / rate;
        return v.empty() ? 0.0 : static_cast<double>(v.size()) / seconds_per_token;
    };
    const auto line = [&](const char* statistic, double ours_rate, double theirs_rate) {
        const std::string theirs_figures =
            theirs.empty() ? std::string("libtorch_tokens_per_s=NA ratio=NA")
                           : fmt::format("libtorch_tokens_per_s={:.0f} ratio={:.3f}", theirs_rate, ours_rate / theirs_rate);
        fmt::print("charlm L={} D={} T={} tapegrad_tokens_per_s={:.0f} {} kernel={} statistic={}\n", c.layers, c.width,
                   c.context, ours_rate, theirs_figures, attention_kernel_name(side.kernel), statistic);
    };
    line("median", median(side.rates), theirs.empty() ? 0.0 : median(theirs));
    line("best", best(side.rates), best(theirs));
    line("overall", overall(side.rates), overall(theirs));
}

#ifdef TAPEGRAD_HAVE_TORCH
// LibTorch's GEMMs go to whatever libblas.so.3 the system selects (Debian's LibTorch is built with
// BLAS_INFO=generic): the reference BLAS unless OpenBLAS provides it. The rate of one warm GEMM of
// the MLP's shape (tokens × D times D × 4D) shows which, since it dominates LibTorch's step.
void print_libtorch_gemm_rate(long tokens, long width) {
    const torch::Tensor a = torch::rand({tokens, width}, torch::kDouble), b = torch::rand({width, 4 * width}, torch::kDouble);
    for (int round = 0; round < 3; ++round) (void)a.mm(b);  // warm-up: BLAS start-up, first page faults
    std::vector<double> samples;
    for (int round = 0; round < 21; ++round) {
        const double start = thread_seconds();
        const torch::Tensor product = a.mm(b);
        samples.push_back(thread_seconds() - start);
    }
    fmt::print("libtorch_gemm m={} k={} n={} gflops={:.1f}\n", a.size(0), a.size(1), b.size(1),
               2.0 * static_cast<double>(a.numel() * b.size(1)) / median(samples) / 1e9);
}
#endif

}  // namespace

int main() {
    set_threads(1);
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(1);
#endif
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    const char* blas_threads = std::getenv("OPENBLAS_NUM_THREADS");
    fmt::print("environment OPENBLAS_CORETYPE={} OPENBLAS_NUM_THREADS={} cpu={}\n", coretype ? coretype : "unset",
               blas_threads ? blas_threads : "unset", cpu_level_name(cpu_level()));

    const CharLmSettings settings{};  // the example's defaults
    const Corpus corpus = benchmark_corpus();
    std::deque<Side> ours;
    for (const AttentionKernel kernel : {AttentionKernel::fused, AttentionKernel::composed}) {
        ours.emplace_back(settings, kernel, corpus);
    }
    const TransformerConfig& c = ours.front().trainer.config();
    const double tokens_per_step = static_cast<double>(settings.batch * settings.context);
    constexpr std::size_t rounds = 41, steps_per_round = 2, checked_steps = 3;  // 41: a steady median on a shared machine
    std::vector<double> theirs_rates;

#ifdef TAPEGRAD_HAVE_TORCH
    print_libtorch_gemm_rate(static_cast<long>(tokens_per_step), static_cast<long>(c.width));
    TorchCharLm theirs(ours.front().trainer.parameters(), c, settings);
    std::size_t their_steps = 0;
    const auto their_step = [&] {
        const double loss = theirs.step(training_batch(corpus, settings, their_steps), settings.schedule().rate(their_steps));
        ++their_steps;
        return loss;
    };
    // Same computation first: the losses of the first steps must agree (all from one start).
    double worst = 0;
    for (std::size_t s = 0; s < checked_steps; ++s) {
        const double b = their_step();
        for (Side& side : ours) worst = std::max(worst, std::abs(side.trainer.step() - b) / std::abs(b));
    }
    if (!(worst <= 1e-9)) fmt::print("WARNING: the first losses differ from LibTorch's by {:.3g} (relative)\n", worst);
    fmt::print("agreement first_{}_losses_max_relative_difference={:.2e}\n", checked_steps, worst);
#endif
    const auto timed_rate = [&](const auto& step) {
        const double start = thread_seconds();
        for (std::size_t s = 0; s < steps_per_round; ++s) step();
        return tokens_per_step * steps_per_round / (thread_seconds() - start);
    };
    for (std::size_t round = 0; round < rounds; ++round) {
        for (Side& side : ours) side.rates.push_back(timed_rate([&] { side.trainer.step(); }));
#ifdef TAPEGRAD_HAVE_TORCH
        theirs_rates.push_back(timed_rate(their_step));
#endif
    }
    for (const Side& side : ours) print_lines(side, theirs_rates, c);
    fmt::print("sizes B={} H={} V={} steps_per_round={} rounds={}\n", settings.batch, c.heads, c.vocabulary,
               steps_per_round, rounds);
    return 0;
}
