// bench_charlm: training throughput (tokens per second, one thread) of the character-level
// language model of models/charlm.hpp at the example's default size, tapegrad against the same
// model written in LibTorch C++ (the engines compared, not Python): each side runs complete
// training steps (forward, backward, global-norm clipping, AdamW with the warm-up + cosine rate)
// from the same initial parameters on the same batches. In float64, tapegrad runs twice, with each
// attention kernel (fused, the example's default, and composed), against LibTorch in float64; in
// float32, tapegrad's float trainer (BasicCharLmTrainer<float>: float32 parameters, gradients and
// Adam moments; fused kernel) against LibTorch in float32, both from the float64 initial
// parameters rounded to float32; in bfloat16, the float trainer with bfloat16 products
// (CharLmSettings::products) against LibTorch's float32 model under torch.autocast to bfloat16
// (training.hpp), with a line of our bfloat16 step over our float32 step. All seven contenders alternate, round by round, on this thread's
// CPU clock; the lines give the median and the best round:
//   charlm L=… D=… T=… tapegrad_tokens_per_s=… libtorch_tokens_per_s=… ratio=… kernel=fused|composed
//     statistic=median|best|overall dtype=float64|float32|bfloat16
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
#include "training.hpp"
#include "tools/options.hpp"

#include <fmt/format.h>

#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifdef TAPEGRAD_HAVE_TORCH
#include <torch/torch.h>
#endif

using namespace tapegrad;

namespace {

using bench::best_of;
using timing::median;

#ifdef TAPEGRAD_HAVE_TORCH
// The model of models/transformer.hpp in LibTorch: the same parameters in the same layout (rows
// projected as X·W), pre-norm blocks, causal multi-head attention scaled by 1/√dh, GELU (tanh),
// tied output projection, mean cross-entropy; trained by bench::TorchTraining (LibTorch's AdamW,
// decay on matrices only, and clip_grad_norm_). The dtype is the initial parameters' (double or
// float); LibTorch computes in it throughout, its optimizer's scalars in double as PyTorch's.
class TorchCharLm {
public:
    template <class T>
    TorchCharLm(const std::vector<Tensor<T>>& initial, const TransformerConfig& c, const CharLmSettings& s)
        : config_(c), training_(initial, s) {}

    double step(const CharBatch& batch, double rate) {
        return training_.step([&] { return forward(batch); }, rate);
    }

private:
    const torch::Tensor& parameter(std::size_t i) const { return training_.parameters()[i]; }

    torch::Tensor layer_norm(const torch::Tensor& X, std::size_t gain) const {
        return torch::layer_norm(X, {static_cast<long>(config_.width)}, parameter(gain), parameter(gain + 1),
                                 config_.layer_norm.epsilon);
    }

    torch::Tensor attention(const torch::Tensor& a, std::size_t first) const {
        const long B = a.size(0), T = a.size(1), H = static_cast<long>(config_.heads), dh = a.size(2) / H;
        const auto heads = [&](const torch::Tensor& W) { return a.matmul(W).view({B, T, H, dh}).transpose(1, 2); };
        const torch::Tensor Q = heads(parameter(first)), K = heads(parameter(first + 1)),
                            V = heads(parameter(first + 2));
        const torch::Tensor hidden = torch::ones({T, T}, torch::kBool).triu(1);  // key after query
        const torch::Tensor S = Q.matmul(K.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
        const torch::Tensor A = torch::softmax(S.masked_fill(hidden, -std::numeric_limits<double>::infinity()), -1);
        return A.matmul(V).transpose(1, 2).reshape({B, T, H * dh}).matmul(parameter(first + 3));
    }

    torch::Tensor forward(const CharBatch& batch) const {
        const torch::Tensor tokens = bench::token_tensor(batch.tokens, batch.size);
        const long T = tokens.size(1);
        const torch::Tensor& E = parameter(0);
        torch::Tensor X =
            E.index_select(0, tokens.flatten()).view({tokens.size(0), T, -1}) + parameter(1).slice(0, 0, T);
        for (std::size_t l = 0; l < config_.layers; ++l) {
            const std::size_t b = 2 + 12 * l;  // ln1 gain, bias, W_Q, W_K, W_V, W_O, ln2 gain, bias, W_1, b_1, W_2, b_2
            X = X + attention(layer_norm(X, b), b + 2);
            const torch::Tensor hidden =
                torch::gelu(layer_norm(X, b + 6).matmul(parameter(b + 8)) + parameter(b + 9), "tanh");
            X = X + hidden.matmul(parameter(b + 10)) + parameter(b + 11);
        }
        const torch::Tensor logits = layer_norm(X, training_.parameters().size() - 2).matmul(E.t());
        return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}),
                                                    bench::token_tensor(batch.targets, batch.size).flatten());
    }

    TransformerConfig config_;
    bench::TorchTraining training_;
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
};

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
    const double tokens = static_cast<double>(defaults.batch * defaults.context);
    std::vector<double> whole_rates, one_rates, two_rates;
    const auto rate = [&](BasicCharLmTrainer<float>& trainer, unsigned threads) {
        set_threads(threads);
        return bench::wall_rate([&] { trainer.step(); }, steps_per_round, tokens);
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

}  // namespace

int main(int argc, char** argv) {
    tapegrad::timing::keep_freed_memory();  // before any contender allocates (timing.hpp says why)
    bench::RoundSettings rounds;
    try {  // numbers read the way every program of the project reads them (tools/options.hpp)
        for (int a = 1; a < argc; ++a) {
            const std::string argument = argv[a];
            if ((argument == "--steps-per-round" || argument == "--rounds") && a + 1 == argc) {
                throw cli::usage_error(fmt::format("{} needs a number", argument));
            }
            if (argument == "--per-round") {
                rounds.per_round = true;
            } else if (argument == "--steps-per-round") {
                rounds.steps_per_round =
                    cli::integer_argument("--steps-per-round", argv[++a], std::size_t{1}, std::size_t{1000});
            } else if (argument == "--rounds") {
                rounds.rounds = cli::integer_argument("--rounds", argv[++a], std::size_t{1}, std::size_t{100000});
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
    bench::print_environment_line();
    timing::print_host_line();
    const CharLmSettings settings{};  // the example's defaults
    const Corpus corpus = bench::benchmark_corpus();
    std::deque<Side<double>> ours;
    for (const AttentionKernel kernel : {AttentionKernel::fused, AttentionKernel::composed}) {
        ours.emplace_back(settings, kernel, corpus);
    }
    std::deque<Side<float>> ours_float;  // the example's default kernel
    ours_float.emplace_back(settings, AttentionKernel::fused, corpus);
    CharLmSettings bfloat16_settings = settings;  // the float trainer with bfloat16 products
    bfloat16_settings.products = ProductPrecision::bfloat16;
    std::deque<Side<float>> ours_bfloat16;
    ours_bfloat16.emplace_back(bfloat16_settings, AttentionKernel::fused, corpus);
    const TransformerConfig& c = ours.front().trainer.config();
    rounds.tokens_per_step = static_cast<double>(settings.batch * settings.context);
    const std::size_t tokens = settings.batch * settings.context;

    // The MLP's product, tokens × D times D × 4D, at which the GEMM lines compare the two engines.
    bench::print_tapegrad_gemm_rate<double>(tokens, c.width, 4 * c.width);
    bench::print_tapegrad_gemm_rate<float>(tokens, c.width, 4 * c.width);
    std::vector<bench::Contender> contenders;
    for (Side<double>& side : ours) {
        contenders.push_back({fmt::format("tapegrad_float64_{}", attention_kernel_name(side.kernel)),
                              [&side] { side.trainer.step(); },
                              {}});
    }
#ifdef TAPEGRAD_HAVE_TORCH
    for (const torch::ScalarType type : {torch::kDouble, torch::kFloat}) {
        bench::print_libtorch_gemm_rate(static_cast<long>(tokens), static_cast<long>(c.width),
                                        static_cast<long>(4 * c.width), type);
    }
    TorchCharLm theirs(ours.front().trainer.parameters(), c, settings);
    TorchCharLm theirs_float(ours_float.front().trainer.parameters(), c, settings);
    TorchCharLm theirs_autocast(ours_float.front().trainer.parameters(), c, bfloat16_settings);
    std::size_t their_steps = 0, their_float_steps = 0, their_autocast_steps = 0;
    const auto stepper = [&corpus, &settings](TorchCharLm& model, std::size_t& steps) {
        return [&corpus, &settings, &model, &steps] {
            const double loss = model.step(training_batch(corpus, settings, steps), settings.schedule().rate(steps));
            ++steps;
            return loss;
        };
    };
    const std::function<double()> their_step = stepper(theirs, their_steps);
    const std::function<double()> their_float_step = stepper(theirs_float, their_float_steps);
    const std::function<double()> their_autocast_step = stepper(theirs_autocast, their_autocast_steps);
    // Same computation first: the losses of the first steps must agree (all from one start).
    const auto our_steps = [](auto& sides) {
        std::vector<std::function<double()>> steps;
        for (auto& side : sides) steps.push_back([&side] { return side.trainer.step(); });
        return steps;
    };
    bench::check_agreement(their_step, our_steps(ours), "float64", 1e-9);
    bench::check_agreement(their_float_step, our_steps(ours_float), "float32", 1e-5);
    // bfloat16 against autocast: not one computation (autocast also rounds each product's output to
    // bfloat16, ours keeps float32), so only near: the first losses within 1% of each other.
    bench::check_agreement(their_autocast_step, our_steps(ours_bfloat16), "bfloat16", 1e-2);
    contenders.push_back({"libtorch_float64", [&] { their_step(); }, {}});
#endif
    for (Side<float>& side : ours_float)
        contenders.push_back({"tapegrad_float32_fused", [&side] { side.trainer.step(); }, {}});
#ifdef TAPEGRAD_HAVE_TORCH
    contenders.push_back({"libtorch_float32", [&] { their_float_step(); }, {}});
#endif
    for (Side<float>& side : ours_bfloat16)
        contenders.push_back({"tapegrad_bfloat16_fused", [&side] { side.trainer.step(); }, {}});
#ifdef TAPEGRAD_HAVE_TORCH
    contenders.push_back({"libtorch_autocast_bfloat16", [&] { their_autocast_step(); }, {}});
#endif
    bench::run_rounds(contenders, rounds);
    const auto rates_of = [&](std::string_view name) {
        for (const bench::Contender& contender : contenders)
            if (contender.name == name) return contender.rates;
        return std::vector<double>{};
    };
    const std::string model = fmt::format("charlm L={} D={} T={}", c.layers, c.width, c.context);
    for (const Side<double>& side : ours) {
        const std::string_view kernel = attention_kernel_name(side.kernel);
        bench::print_ratio_lines(model, rates_of(fmt::format("tapegrad_float64_{}", kernel)),
                                 rates_of("libtorch_float64"), kernel, "float64");
    }
    bench::print_ratio_lines(model, rates_of("tapegrad_float32_fused"), rates_of("libtorch_float32"), "fused",
                             "float32");
    bench::print_ratio_lines(model, rates_of("tapegrad_bfloat16_fused"), rates_of("libtorch_autocast_bfloat16"),
                             "fused", "bfloat16");
    bench::print_precision_speedup(model, rates_of("tapegrad_bfloat16_fused"), rates_of("tapegrad_float32_fused"));
    if (std::thread::hardware_concurrency() > 1)
        bench_two_threads(settings, corpus, rounds.rounds, rounds.steps_per_round);
    fmt::print("sizes B={} H={} V={} steps_per_round={} rounds={}\n", settings.batch, c.heads, c.vocabulary,
               rounds.steps_per_round, rounds.rounds);
    return 0;
}
