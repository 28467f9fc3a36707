// bench_llama: training throughput (tokens per second) of the LLaMA-style decoder of
// models/llama.hpp at the char-LM's default size, tapegrad against the same model written in
// LibTorch C++ (the engines compared, not Python), one thread and two. The model: vocabulary the
// corpus alphabet (as bench_charlm's), context T = 64, batch B = 16, L = 2 blocks, D = 64, H = 4
// query heads, H_kv = 2 key/value heads, SwiGLU hidden width F = 205, output tied through Eᵀ,
// pre-norm RMSNorm (ε = 1e-6 inside the root), RoPE base 10000 in Meta's interleaved pairing.
// A training step on either side is what models/charlm.hpp's BasicCharLmTrainer::step does, with
// the char-LM's training settings (CharLmSettings: the batch of step s drawn by training_batch,
// global-norm clipping at 1, AdamW with β2 0.99 and decay 0.1 on matrices only, warm-up + cosine
// rate): forward, backward, clipping, AdamW, from the same initial parameters (initial_parameters
// (LlamaConfig), rounded to float32 for the float32 sides) on the same batches. Tapegrad's step is
// written here from the library's calls (a reused Tape<T> per micro-batch, LlamaVars<T>,
// llama_loss, clip_by_global_norm, BasicAdam<T>, WarmupCosine). LibTorch's model is written from
// the formulas, not from tapegrad's code:
//   RMSNorm   x·rsqrt(mean(x²) + ε)·g
//   RoPE      pairs (x_{2i}, x_{2i+1}) rotated by θ_i = p·base^(−2i/dh) (ops/rope.hpp); the cos/sin
//             table computed once, as Meta's freqs_cis, in the model's dtype by ops/rope.hpp's formula
//   GQA       K, V heads repeated for each group of H/H_kv consecutive query heads (Hugging Face's
//             repeat_kv: expand and reshape)
//   attention softmax(Q·Kᵀ/√dh, causal)·V, composed (LibTorch 1.13 has no fused attention)
//   SwiGLU    (silu(h·W_gate) ∘ (h·W_up))·W_down;   logits h·Eᵀ;   mean cross-entropy
// and trained by LibTorch's own AdamW and clip_grad_norm_ (benchmarks/training.hpp, as
// bench_charlm). Contenders, alternating round by round on this thread's CPU clock: tapegrad
// float64 with the fused attention kernel and with the composed one, LibTorch float64, tapegrad
// float32 (fused), LibTorch float32. The lines give the median, best and overall rounds:
//   llama L=… D=… T=… H=… H_kv=… F=… tapegrad_tokens_per_s=… libtorch_tokens_per_s=… ratio=…
//     kernel=fused|composed statistic=median|best|overall dtype=float64|float32
// (ratio = tapegrad's tokens/s over LibTorch's in the same dtype; overall: all rounds' tokens over
// all rounds' time). Before timing, the first steps' losses of every side are compared with
// LibTorch's in the same dtype, to 1e-9 (relative) in float64 and 1e-5 in float32 (bench_charlm
// says why float32 cannot be held closer), or a WARNING says the lines do not compare the same
// computation.
// On a machine with two or more cores, the last lines time each dtype on two threads, on the wall
// clock, five contenders alternating from one start: tapegrad's batch on one tape and one thread,
// in two micro-batches (two tapes, summed in part order) on one thread and on two threads
// (set_threads(2): parallel_for runs the two tapes at once; one tape's ops are too small at this
// size to split), LibTorch on one thread and on two (torch::set_num_threads(2), its intra-op
// threads, and OpenBLAS's own threads set to 2 through openblas_set_num_threads when LibTorch's
// BLAS is OpenBLAS; the reference BLAS has no threads). A line says what each side's two threads
// are, with OMP_WAIT_POLICY (LibTorch's OpenMP threads spin between ops unless it is passive):
//   llama_threads_use dtype=… tapegrad_two_threads="…" libtorch_intra_op_threads=2
//     libtorch_blas=openblas_threads=2|not_openblas_threads=1 OMP_WAIT_POLICY=…
//   llama_threads dtype=… statistic=median|best tapegrad_one_tape_one_thread_tokens_per_s=…
//     tapegrad_two_micro_batches_one_thread_tokens_per_s=… tapegrad_two_micro_batches_two_threads_tokens_per_s=…
//     libtorch_one_thread_tokens_per_s=… libtorch_two_threads_tokens_per_s=… tapegrad_speedup_same_step=…
//     libtorch_speedup=… ratio_two_threads=… parameters_bitwise_equal=…
// (ratio_two_threads: tapegrad's two micro-batches on two threads over LibTorch on two threads;
// parameters_bitwise_equal: the micro-batched trainers' parameters after their steps on one thread
// and on two, which must be equal to the bit, or a WARNING says so).
//   OPENBLAS_NUM_THREADS=1 bench_llama [--rounds N] [--steps-per-round N] [--per-round]
//                                      [--layers L] [--width D] [--heads H] [--kv-heads H_kv]
//                                      [--hidden F] [--context T] [--batch B]
// (--rounds: default 41, a smaller N for a smoke run; --per-round: a line per round and contender
// with its rate, each step's milliseconds, its minor page faults and its wall over CPU time;
// --help lists the options). The lines open with the environment line (host CPU,
// OPENBLAS_CORETYPE, OPENBLAS_NUM_THREADS, tapegrad's kernel level), the host's GEMM rates
// (host.hpp) and the GEMM rates of both engines at the MLP's product (tokens × D times D × F):
// LibTorch's products go to the system's libblas.so.3, several times slower when it is the
// reference BLAS rather than OpenBLAS.
#include "models/llama.hpp"
#include "tapegrad.hpp"
#include "host.hpp"
#include "timing.hpp"
#include "training.hpp"
#include "tools/options.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <cmath>
#include <concepts>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef TAPEGRAD_HAVE_TORCH
#include <dlfcn.h>
#include <torch/torch.h>
#endif

using namespace tapegrad;

namespace {

namespace po = boost::program_options;
using bench::best_of;
using timing::median;

// The decoder's training step in tapegrad, as BasicCharLmTrainer<T>::step takes the char-LM's: the
// parameters outside the tape (float64, or the float64 initialisation rounded to float32), one
// reused Tape<T> per micro-batch recording llama_loss on its part of the batch of step s, the
// parts' gradients weighed by their share of the sequences and summed in part order (the result
// depends on the parts, never on the threads running them), clipping to the global norm, AdamW at
// the schedule's rate of step s.
template <std::floating_point T>
class LlamaTraining {
public:
    LlamaTraining(const LlamaConfig& c, const CharLmSettings& s, const Corpus& corpus)
        : config_(c),
          settings_(s),
          corpus_(corpus),
          names_(parameter_names(c)),
          parameters_(initial(c)),
          adam_(s.adam()) {
        for (std::size_t part = 0; part < s.micro_batches; ++part) tapes_.emplace_back().set_product_precision(s.products);
    }

    // One AdamW step on the batch of step number steps_done(); returns the loss before it.
    double step() {
        const std::size_t s = adam_.steps();
        const double loss = forward_backward(training_batch(corpus_, settings_, s));
        clip_by_global_norm(gradient_pointers_, settings_.clip_norm);
        adam_.set_learning_rate(settings_.schedule().rate(s));
        std::vector<Tensor<T>*> parameters;
        for (Tensor<T>& p : parameters_) parameters.push_back(&p);
        const std::vector<const Tensor<T>*> gradients(gradient_pointers_.begin(), gradient_pointers_.end());
        adam_.step(parameters, gradients);
        return loss;
    }

    const std::vector<Tensor<T>>& parameters() const { return parameters_; }

private:
    static std::vector<Tensor<T>> initial(const LlamaConfig& c) {
        std::vector<Tensor<T>> values;
        for (const Tensor<double>& p : initial_parameters(c)) values.push_back(tensor_cast<T>(p));
        return values;
    }

    // The batch's mean loss; its gradients, in parameter order, left in gradients_ (clipping
    // scales them). Part p of P holds sequences [p·B/P, (p+1)·B/P) and weighs B_p/B.
    double forward_backward(const CharBatch& batch) {
        const std::size_t parts = tapes_.size(), context = settings_.context;
        const auto first_sequence = [&](std::size_t part) { return part * batch.size / parts; };
        std::vector<std::vector<Var<T>>> leaves(parts);
        std::vector<Var<T>> losses(parts);
        parallel_for(parts, [&](std::size_t part, unsigned) {
            const std::size_t first = first_sequence(part), count = first_sequence(part + 1) - first;
            Tape<T>& tape = tapes_[part];
            tape.clear();
            std::vector<Var<T>> recorded;
            for (std::size_t i = 0; i < parameters_.size(); ++i)
                recorded.push_back(tape.leaf(parameters_[i], names_[i]));
            const LlamaVars<T> vars = LlamaVars<T>::from(recorded, config_);
            const auto window = [&](const std::vector<std::size_t>& v) {
                return std::span<const std::size_t>(v).subspan(first * context, count * context);
            };
            losses[part] = llama_loss(vars, config_, window(batch.tokens), window(batch.targets), count);
            tape.backward(losses[part]);
            leaves[part] = vars.all();
        });
        gradients_.resize(parameters_.size());
        gradient_pointers_.clear();
        double loss = 0;
        for (std::size_t part = 0; part < parts; ++part) {
            const std::size_t count = first_sequence(part + 1) - first_sequence(part);
            const T weight = static_cast<T>(count) / static_cast<T>(batch.size);
            loss += static_cast<double>(weight) * static_cast<double>(losses[part].value().item());
            for (std::size_t i = 0; i < gradients_.size(); ++i) {
                const std::span<const T> g = leaves[part][i].grad().data();
                if (part == 0) gradients_[i] = leaves[part][i].grad();
                const std::span<T> sum = gradients_[i].data();
                for (std::size_t k = 0; k < sum.size(); ++k)
                    sum[k] = part == 0 ? weight * g[k] : sum[k] + weight * g[k];
            }
        }
        for (Tensor<T>& g : gradients_) gradient_pointers_.push_back(&g);
        return loss;
    }

    LlamaConfig config_;
    CharLmSettings settings_;
    const Corpus& corpus_;
    std::vector<std::string> names_;
    std::vector<Tensor<T>> parameters_;
    BasicAdam<T> adam_;
    std::deque<Tape<T>> tapes_;  // one per micro-batch (tapes do not move: a deque keeps them in place)
    std::vector<Tensor<T>> gradients_;
    std::vector<Tensor<T>*> gradient_pointers_;
};

#ifdef TAPEGRAD_HAVE_TORCH
// The decoder in LibTorch (the header comment has its formulas): parameters in parameter_names()
// order and layout (rows projected as X·W), trained by bench::TorchTraining. The dtype is the
// initial parameters' (double or float); LibTorch computes in it throughout.
class TorchLlama {
public:
    template <std::floating_point T>
    TorchLlama(const std::vector<Tensor<T>>& initial, const LlamaConfig& c, const CharLmSettings& s)
        : config_(c), training_(initial, s) {
        rope_table<T>();
    }

    double step(const CharBatch& batch, double rate) {
        return training_.step([&] { return loss(batch); }, rate);
    }

private:
    const torch::Tensor& parameter(std::size_t i) const { return training_.parameters()[i]; }

    // cos θ and sin θ [context, dh/2] of pair i at position p, θ = p·base^(−2i/dh), computed in T
    // the way ops/rope.hpp computes its table (so both sides rotate by the same rounded angles).
    template <std::floating_point T>
    void rope_table() {
        const std::size_t rows = config_.context, d = config_.head_width(), half = d / 2;
        std::vector<T> cosines(rows * half), sines(rows * half);
        const T log_base = std::log(static_cast<T>(config_.rope_base));
        for (std::size_t i = 0; i < half; ++i) {
            const T frequency = std::exp(T(-T(2 * i) / T(d) * log_base));
            for (std::size_t t = 0; t < rows; ++t) {
                const T theta = T(t) * frequency;
                cosines[t * half + i] = std::cos(theta);
                sines[t * half + i] = std::sin(theta);
            }
        }
        const std::vector<long> shape = {static_cast<long>(rows), static_cast<long>(half)};
        cos_ = torch::from_blob(cosines.data(), shape, bench::torch_type<T>()).clone();
        sin_ = torch::from_blob(sines.data(), shape, bench::torch_type<T>()).clone();
    }

    torch::Tensor rms_norm(const torch::Tensor& X, std::size_t gain) const {
        return X * torch::rsqrt(X.pow(2).mean(-1, true) + config_.rms_norm.epsilon) * parameter(gain);
    }

    // x [B, n, T, dh]: each pair (x_{2i}, x_{2i+1}) of row t rotated by θ_{t,i}.
    torch::Tensor rope(const torch::Tensor& x) const {
        const long T = x.size(2), half = x.size(3) / 2;
        const torch::Tensor pairs = x.reshape({x.size(0), x.size(1), T, half, 2});
        const torch::Tensor even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
        const torch::Tensor c = cos_.slice(0, 0, T), s = sin_.slice(0, 0, T);
        return torch::stack({even * c - odd * s, even * s + odd * c}, -1).flatten(-2);
    }

    torch::Tensor attention(const torch::Tensor& h, std::size_t first) const {
        const long B = h.size(0), T = h.size(1), H = static_cast<long>(config_.heads),
                   H_kv = static_cast<long>(config_.kv_heads), dh = static_cast<long>(config_.head_width());
        const auto heads = [&](const torch::Tensor& W, long n) {
            return h.matmul(W).view({B, T, n, dh}).transpose(1, 2);
        };
        const auto repeat = [&](const torch::Tensor& X) {  // key/value head h/g for query head h
            return X.unsqueeze(2).expand({B, H_kv, H / H_kv, T, dh}).reshape({B, H, T, dh});
        };
        const torch::Tensor Q = rope(heads(parameter(first), H));
        const torch::Tensor K = repeat(rope(heads(parameter(first + 1), H_kv)));
        const torch::Tensor V = repeat(heads(parameter(first + 2), H_kv));
        const torch::Tensor hidden = torch::ones({T, T}, torch::kBool).triu(1);  // key after query
        const torch::Tensor S = Q.matmul(K.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
        const torch::Tensor A = torch::softmax(S.masked_fill(hidden, -std::numeric_limits<double>::infinity()), -1);
        return A.matmul(V).transpose(1, 2).reshape({B, T, H * dh}).matmul(parameter(first + 3));
    }

    torch::Tensor loss(const CharBatch& batch) const {
        const torch::Tensor tokens = bench::token_tensor(batch.tokens, batch.size);
        const torch::Tensor& E = parameter(0);
        torch::Tensor X = E.index_select(0, tokens.flatten()).view({tokens.size(0), tokens.size(1), -1});
        for (std::size_t l = 0; l < config_.layers; ++l) {
            const std::size_t b = 1 + 9 * l;  // attn gain, W_Q, W_K, W_V, W_O, mlp gain, W_gate, W_up, W_down
            X = X + attention(rms_norm(X, b), b + 1);
            const torch::Tensor m = rms_norm(X, b + 5);
            X = X + (torch::silu(m.matmul(parameter(b + 6))) * m.matmul(parameter(b + 7))).matmul(parameter(b + 8));
        }
        const torch::Tensor logits = rms_norm(X, 1 + 9 * config_.layers).matmul(E.t());
        return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}),
                                                    bench::token_tensor(batch.targets, batch.size).flatten());
    }

    LlamaConfig config_;
    bench::TorchTraining training_;
    torch::Tensor cos_, sin_;
};

// A LibTorch model with the number of steps it has taken: each call steps on the batch of that
// step number at the schedule's rate, as our trainers draw theirs.
struct TorchSide {
    template <std::floating_point T>
    TorchSide(const std::vector<Tensor<T>>& initial, const LlamaConfig& c, const CharLmSettings& s,
              const Corpus& corpus)
        : model(initial, c, s), settings(s), corpus(corpus) {}
    double step() {
        const double loss = model.step(training_batch(corpus, settings, steps), settings.schedule().rate(steps));
        ++steps;
        return loss;
    }
    TorchLlama model;
    CharLmSettings settings;
    const Corpus& corpus;
    std::size_t steps = 0;
};

// LibTorch's threads: its intra-op threads (torch::set_num_threads; OpenMP in Debian's build) and
// those of the BLAS its products go to, libblas.so.3 as loaded with LibTorch. LibTorch's setting
// does not reach OpenBLAS, whose count OPENBLAS_NUM_THREADS=1 fixes at start-up, so it is set
// through OpenBLAS's own openblas_set_num_threads: Debian's OpenBLAS libblas.so.3 is a wrapper
// around libopenblas.so.0, and dlsym on the wrapper's handle searches its dependencies too. The
// reference BLAS has no threads (and no such function).
class LibTorchThreads {
public:
    LibTorchThreads() {
        handle_ = dlopen("libblas.so.3", RTLD_LAZY | RTLD_NOLOAD);
        if (handle_ != nullptr) {
            set_threads_ = reinterpret_cast<void (*)(int)>(dlsym(handle_, "openblas_set_num_threads"));
        }
    }
    ~LibTorchThreads() {
        if (handle_ != nullptr) dlclose(handle_);
    }
    LibTorchThreads(const LibTorchThreads&) = delete;
    LibTorchThreads& operator=(const LibTorchThreads&) = delete;

    // LibTorch's intra-op threads and, with OpenBLAS, its BLAS threads.
    void use_threads(int threads) {
        torch::set_num_threads(threads);
        if (set_threads_ != nullptr) set_threads_(threads);
        if (threads > 1) {  // what the rounds on several threads ran on, as LibTorch took it
            intra_op_threads_ = torch::get_num_threads();
            blas_threads_ = set_threads_ != nullptr ? threads : 1;
        }
    }
    // What LibTorch's rounds on several threads ran on, for the threads' line. OMP_WAIT_POLICY
    // decides how its OpenMP threads wait between ops: spinning (libgomp's default) is the fast way
    // on idle cores and ruinous on busy ones (a smoke run beside two builds on two cores: LibTorch's
    // two-thread step 40 times slower than its one-thread step; 1.5 times slower with
    // OMP_WAIT_POLICY=passive), so the line names it.
    std::string description() const {
        const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
        return fmt::format("libtorch_intra_op_threads={} libtorch_blas={}_threads={} OMP_WAIT_POLICY={}",
                           intra_op_threads_, set_threads_ != nullptr ? "openblas" : "not_openblas", blas_threads_,
                           wait_policy ? wait_policy : "unset");
    }

private:
    void* handle_ = nullptr;
    void (*set_threads_)(int) = nullptr;
    int intra_op_threads_ = 1, blas_threads_ = 1;
};
#endif

// Two threads against one, in dtype T, on the wall clock (the header comment lists the contenders):
// tapegrad's one-tape step on one thread, its two micro-batches on one thread and on two, LibTorch's
// step on one thread and on two, all from the same start, alternating round by round.
template <std::floating_point T>
void bench_two_threads(const LlamaConfig& c, const CharLmSettings& settings, const Corpus& corpus,
                       const bench::RoundSettings& r) {
    CharLmSettings halves = settings;
    halves.micro_batches = 2;
    LlamaTraining<T> whole(c, settings, corpus), one(c, halves, corpus), two(c, halves, corpus);
    std::vector<double> whole_rates, one_rates, two_rates, theirs_one_rates, theirs_two_rates;
    const auto rate = [&](auto& trainer, unsigned threads) {
        set_threads(threads);
        return bench::wall_rate([&] { trainer.step(); }, r.steps_per_round, r.tokens_per_step);
    };
#ifdef TAPEGRAD_HAVE_TORCH
    LibTorchThreads threads;
    TorchSide theirs_one(whole.parameters(), c, settings, corpus), theirs_two(whole.parameters(), c, settings, corpus);
    const auto their_rate = [&](TorchSide& side, int count) {
        threads.use_threads(count);
        const double rate = bench::wall_rate([&] { side.step(); }, r.steps_per_round, r.tokens_per_step);
        threads.use_threads(1);
        return rate;
    };
#endif
    for (std::size_t round = 0; round < r.rounds; ++round) {
        whole_rates.push_back(rate(whole, 1));
        one_rates.push_back(rate(one, 1));
        two_rates.push_back(rate(two, 2));
        set_threads(1);
#ifdef TAPEGRAD_HAVE_TORCH
        theirs_one_rates.push_back(their_rate(theirs_one, 1));
        theirs_two_rates.push_back(their_rate(theirs_two, 2));
#endif
    }
    const bool same = one.parameters() == two.parameters();  // shapes and every element
    if (!same) fmt::print("WARNING: the one- and two-thread {} trainers' parameters differ\n", dtype_name<T>());
#ifdef TAPEGRAD_HAVE_TORCH
    fmt::print(
        "llama_threads_use dtype={} tapegrad_two_threads=\"set_threads(2), 2 micro-batches of {} sequences on "
        "their own tapes\" {}\n",
        dtype_name<T>(), settings.batch / 2, threads.description());
#endif
    const auto ratio = [](double a, double b) { return b > 0 ? fmt::format("{:.3f}", a / b) : std::string("NA"); };
    for (const auto& [statistic, of] :
         {std::pair{"median", +[](const std::vector<double>& v) { return v.empty() ? 0.0 : median(v); }},
          std::pair{"best", +[](const std::vector<double>& v) { return best_of(v); }}}) {
        fmt::print(
            "llama_threads dtype={} statistic={} tapegrad_one_tape_one_thread_tokens_per_s={:.0f} "
            "tapegrad_two_micro_batches_one_thread_tokens_per_s={:.0f} "
            "tapegrad_two_micro_batches_two_threads_tokens_per_s={:.0f} libtorch_one_thread_tokens_per_s={:.0f} "
            "libtorch_two_threads_tokens_per_s={:.0f} tapegrad_speedup_same_step={} libtorch_speedup={} "
            "ratio_two_threads={} parameters_bitwise_equal={}\n",
            dtype_name<T>(), statistic, of(whole_rates), of(one_rates), of(two_rates), of(theirs_one_rates),
            of(theirs_two_rates), ratio(of(two_rates), of(one_rates)),
            ratio(of(theirs_two_rates), of(theirs_one_rates)), ratio(of(two_rates), of(theirs_two_rates)), same);
    }
}

struct Options {
    bench::RoundSettings rounds;
    CharLmSettings training;  // the char-LM's: its batch, context and schedule; layers, width and heads
    LlamaConfig model;        // kv_heads and hidden; the rest from `training` and the corpus
};

// The options, or nothing when --help was asked for. A run whose composed float64 step would not
// fit in memory is refused before anything is allocated; main checks the sizes as the decoder
// checks its config, once the corpus has given the vocabulary.
std::optional<Options> parse(int argc, char** argv) {
    Options o;
    o.model.kv_heads = 2;
    o.model.hidden = 205;
    CharLmSettings& t = o.training;
    using cli::integer;
    constexpr std::size_t one = 1, two = 2;
    po::options_description description("bench_llama options");
    // One option a line, as train_charlm lists its own.
    // clang-format off
    description.add_options()("help", "this text")
        ("rounds", integer(&o.rounds.rounds, one, std::size_t{100000})->default_value(o.rounds.rounds),
         "rounds of alternating contenders (a few for a smoke run)")
        ("steps-per-round",
         integer(&o.rounds.steps_per_round, one, std::size_t{1000})->default_value(o.rounds.steps_per_round),
         "training steps per contender and round")
        ("per-round", po::bool_switch(&o.rounds.per_round), "a line per round and contender")
        ("layers", integer(&t.layers, one, std::size_t{64})->default_value(t.layers), "decoder blocks L")
        ("width", integer(&t.width, two, std::size_t{4096})->default_value(t.width), "model width D")
        ("heads", integer(&t.heads, one, std::size_t{256})->default_value(t.heads), "query heads H")
        ("kv-heads", integer(&o.model.kv_heads, one, std::size_t{256})->default_value(o.model.kv_heads),
         "key/value heads H_kv, dividing H")
        ("hidden", integer(&o.model.hidden, one, std::size_t{65536})->default_value(o.model.hidden),
         "SwiGLU hidden width F")
        ("context", integer(&t.context, one, std::size_t{8192})->default_value(t.context), "characters per sequence T")
        ("batch", integer(&t.batch, two, std::size_t{4096})->default_value(t.batch),
         "sequences per step B (at least 2: the two-thread lines cut it in two)");
    // clang-format on
    po::variables_map values;
    po::store(cli::options_only(argc, argv, description, "bench_llama"), values);  // a stray word refused
    if (values.count("help")) {
        std::cout << description << "\n";
        return std::nullopt;
    }
    po::notify(values);
    LlamaConfig& c = o.model;  // its vocabulary is the corpus's alphabet, read after the options
    c.context = t.context;
    c.width = t.width;
    c.heads = t.heads;
    c.layers = t.layers;
    c.tied = true;
    c.kernel = AttentionKernel::fused;
    c.seed = t.seed;
    // A lower bound on the largest tape, the composed float64 one's: per block at least 8 rows of D
    // (norms, projections, residuals), 4 of F (the SwiGLU products) and 4 of H·T scores (scaled,
    // masked, softmax, their product), values and gradients, 8 bytes each.
    const double rows = static_cast<double>(t.batch) * static_cast<double>(t.context);
    const double per_block = rows * static_cast<double>(8 * t.width + 4 * c.hidden + 4 * t.heads * t.context);
    cli::require_memory(2.0 * per_block * static_cast<double>(t.layers) * 8.0,
                        "the values and gradients of the composed float64 step's tape",
                        fmt::format("--context {} --batch {} --width {} --hidden {} --heads {} --layers {}", t.context,
                                    t.batch, t.width, c.hidden, t.heads, t.layers));
    o.rounds.tokens_per_step = rows;
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    timing::keep_freed_memory();  // before any contender allocates (timing.hpp says why)
    std::optional<Options> options;
    try {  // numbers read the way every program of the project reads them (tools/options.hpp)
        options = parse(argc, argv);
    } catch (const std::exception& e) {
        fmt::print(stderr, "bench_llama: {} (see --help)\n", e.what());
        return cli::exit_usage;
    }
    if (!options) return EXIT_SUCCESS;
    const CharLmSettings& settings = options->training;
    const bench::RoundSettings& rounds = options->rounds;
    const Corpus corpus = bench::benchmark_corpus();
    LlamaConfig c = options->model;
    c.vocabulary = corpus.alphabet.size();
    try {
        check_llama_config(c);  // widths, heads and key/value heads that make a decoder
    } catch (const value_error& e) {
        fmt::print(stderr, "bench_llama: {} (see --help)\n", e.what());
        return cli::exit_usage;
    }
    set_threads(1);
#ifdef TAPEGRAD_HAVE_TORCH
    torch::set_num_threads(1);
#endif
    bench::print_environment_line();
    timing::print_host_line();
    LlamaConfig composed = c;
    composed.kernel = AttentionKernel::composed;
    LlamaTraining<double> ours_fused(c, settings, corpus), ours_composed(composed, settings, corpus);
    LlamaTraining<float> ours_float(c, settings, corpus);
    CharLmSettings bfloat16_settings = settings;  // the float trainer with bfloat16 products
    bfloat16_settings.products = ProductPrecision::bfloat16;
    LlamaTraining<float> ours_bfloat16(c, bfloat16_settings, corpus);

    // The SwiGLU's products, tokens × D times D × F, at which the GEMM lines compare the engines.
    const std::size_t tokens = settings.batch * settings.context;
    bench::print_tapegrad_gemm_rate<double>(tokens, c.width, c.hidden);
    bench::print_tapegrad_gemm_rate<float>(tokens, c.width, c.hidden);
    std::vector<bench::Contender> contenders;
    contenders.push_back({"tapegrad_float64_fused", [&] { ours_fused.step(); }, {}});
    contenders.push_back({"tapegrad_float64_composed", [&] { ours_composed.step(); }, {}});
#ifdef TAPEGRAD_HAVE_TORCH
    for (const torch::ScalarType type : {torch::kDouble, torch::kFloat}) {
        bench::print_libtorch_gemm_rate(static_cast<long>(tokens), static_cast<long>(c.width),
                                        static_cast<long>(c.hidden), type);
    }
    TorchSide theirs(ours_fused.parameters(), c, settings, corpus),
        theirs_float(ours_float.parameters(), c, settings, corpus),
        theirs_autocast(ours_float.parameters(), c, bfloat16_settings, corpus);
    // Same computation first: the losses of the first steps must agree (all from one start).
    bench::check_agreement([&] { return theirs.step(); },
                           {[&] { return ours_fused.step(); }, [&] { return ours_composed.step(); }}, "float64", 1e-9);
    bench::check_agreement([&] { return theirs_float.step(); }, {[&] { return ours_float.step(); }}, "float32", 1e-5);
    // bfloat16 against autocast: not one computation (autocast also rounds each product's output to
    // bfloat16, ours keeps float32), so only near: the first losses within 1% of each other.
    bench::check_agreement([&] { return theirs_autocast.step(); }, {[&] { return ours_bfloat16.step(); }},
                           "bfloat16", 1e-2);
    contenders.push_back({"libtorch_float64", [&] { theirs.step(); }, {}});
#endif
    contenders.push_back({"tapegrad_float32_fused", [&] { ours_float.step(); }, {}});
#ifdef TAPEGRAD_HAVE_TORCH
    contenders.push_back({"libtorch_float32", [&] { theirs_float.step(); }, {}});
#endif
    contenders.push_back({"tapegrad_bfloat16_fused", [&] { ours_bfloat16.step(); }, {}});
#ifdef TAPEGRAD_HAVE_TORCH
    contenders.push_back({"libtorch_autocast_bfloat16", [&] { theirs_autocast.step(); }, {}});
#endif
    bench::run_rounds(contenders, rounds);
    const auto rates_of = [&](std::string_view name) {
        for (const bench::Contender& contender : contenders)
            if (contender.name == name) return contender.rates;
        return std::vector<double>{};
    };
    const std::string model = fmt::format("llama L={} D={} T={} H={} H_kv={} F={}", c.layers, c.width, c.context,
                                          c.heads, c.kv_heads, c.hidden);
    for (const char* kernel : {"fused", "composed"}) {
        bench::print_ratio_lines(model, rates_of(fmt::format("tapegrad_float64_{}", kernel)),
                                 rates_of("libtorch_float64"), kernel, "float64");
    }
    bench::print_ratio_lines(model, rates_of("tapegrad_float32_fused"), rates_of("libtorch_float32"), "fused",
                             "float32");
    bench::print_ratio_lines(model, rates_of("tapegrad_bfloat16_fused"), rates_of("libtorch_autocast_bfloat16"),
                             "fused", "bfloat16");
    bench::print_precision_speedup(model, rates_of("tapegrad_bfloat16_fused"), rates_of("tapegrad_float32_fused"));
    if (std::thread::hardware_concurrency() > 1) {
        bench_two_threads<float>(c, settings, corpus, rounds);
        bench_two_threads<double>(c, settings, corpus, rounds);
    }
    fmt::print("sizes B={} V={} steps_per_round={} rounds={}\n", settings.batch, c.vocabulary, rounds.steps_per_round,
               rounds.rounds);
    return 0;
}
