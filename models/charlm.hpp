/// \file
/// A character-level language model on real text: either the GPT-2-shaped transformer of
/// models/transformer.hpp or the LLaMA-style decoder of models/llama.hpp (CharLmSettings::model),
/// trained with AdamW, warm-up + cosine decay and global-norm clipping (models/optimizer.hpp) on
/// text from Debian's `fortunes` package. The pieces examples/train_charlm.cpp and the tests use:
///   * CharLmSettings: the model family and size and the training schedule (typed, with their
///     defaults; the decoder's defaults hold as many parameters as the GPT-2 model's, to 64);
///   * CharLmGpt2, CharLmLlama: what the trainer needs of each family (its config from the
///     settings, the sizes a checkpoint records, the loss of a batch, the logits of a block
///     continuing a cache); CharLmNetwork holds one of them, and the trainer is the same for both;
///   * Corpus: plain-text files read in the given order, cleaned, split into training and
///     validation text, encoded over the alphabet of characters that occur;
///   * BasicCharLmTrainer<T> (T = double, CharLmTrainer, or float): parameters, optimizer, one
///     reused Tape<T> per micro-batch; a step on the batch of a given step number (drawn from a
///     generator seeded by (seed, step), so a resumed run draws the same batches), its
///     micro-batches on as many threads as the threads setting gives, the validation loss,
///     checkpoints (one .npy per parameter and per Adam moment in T, plus a manifest naming the
///     model family, its sizes and T, written atomically; find_checkpoint finds the last complete
///     one after a killed save) and sampling from a prompt through the model's cache (the
///     transformer's memory of rows, the decoder's keys and values).
#pragma once

#include "autodiff/parallel.hpp"
#include "io/npy.hpp"
#include "io/read_file.hpp"
#include "io/tape_file.hpp"
#include "models/llama.hpp"
#include "models/optimizer.hpp"
#include "models/transformer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace tapegrad {

/// The model families the char-LM trains (CharLmSettings::model, train_charlm --model).
enum class CharLmModel {
    gpt2,   ///< models/transformer.hpp: learned positions, layer norms, GELU MLP, tied output
    llama,  ///< models/llama.hpp: RoPE, RMSNorm, grouped-query attention, SwiGLU MLP
};

constexpr std::string_view char_lm_model_name(CharLmModel model) {
    return model == CharLmModel::llama ? "llama" : "gpt2";
}

/// The family a command line names ("gpt2" or "llama").
inline CharLmModel char_lm_model_from(std::string_view name) {
    for (const CharLmModel model : {CharLmModel::gpt2, CharLmModel::llama}) {
        if (name == char_lm_model_name(model)) return model;
    }
    throw usage_error(fmt::format("the char-LM's model must be 'gpt2' or 'llama', not '{}'", name));
}

struct CharLmSettings {
    CharLmModel model = CharLmModel::gpt2;
    std::size_t layers = 2;
    std::size_t width = 64;
    std::size_t heads = 4;
    /// The decoder's own sizes (model llama; the GPT-2 model has none of them): key/value heads
    /// (grouped-query attention: 2 for 4 query heads), the SwiGLU MLP's width F, and the logits
    /// through Eᵀ (tied, as the GPT-2 model's always are) or a W_out of their own. F = 205 gives
    /// the default decoder 103,616 + V·D parameters against the GPT-2 default's 103,680 + V·D
    /// (tests/test_checkpoints.cpp holds both counts).
    std::size_t kv_heads = 2;
    std::size_t hidden = 205;
    bool tied = true;
    std::size_t context = 64;   ///< T: characters per training sequence
    std::size_t batch = 16;     ///< sequences per step
    std::size_t steps = 6000;   ///< S: the schedule's length
    std::size_t warmup = 200;   ///< W
    double peak_rate = 1e-2;    ///< 3e-3 reached 2.74 bits/char in 2000 steps; see the README
    double floor_ratio = 0.1;   ///< the cosine decays to peak_rate·floor_ratio
    double weight_decay = 0.1;  ///< λ, on matrices only (DecayScope::matrices)
    double clip_norm = 1.0;     ///< global gradient norm cap
    double beta2 = 0.99;        ///< nanoGPT's choice for small character models
    std::uint64_t seed = 1;     ///< initialisation and batches
    /// The same function either way (tests/test_transformer.cpp holds them together); fused keeps no
    /// T×T score matrices on the tape and trains faster (bench_charlm prints both).
    AttentionKernel kernel = AttentionKernel::fused;
    /// Parts the batch is cut into, each recorded and back-propagated on its own tape, on its own
    /// thread when the threads setting gives more than one (1 to `batch`). The parts' gradients are
    /// summed in part order, so results depend on this number but never on the threads; more than
    /// one part changes the gradients' last bits against one part (sums split in two).
    std::size_t micro_batches = 1;
    /// What the model's matrix products read (a float trainer only): bfloat16 trains in mixed
    /// precision as PyTorch's CPU autocast does (train_charlm --dtype bfloat16): every matmul reads
    /// bfloat16 copies and accumulates in float32 (the fused attention kernel's tile products too);
    /// parameters, gradients, Adam's moments, norms, softmax and the loss stay float32
    /// (docs/design.md says why).
    ProductPrecision products = ProductPrecision::tape;

    AdamSettings adam() const {
        return AdamSettings{.learning_rate = peak_rate, .beta2 = beta2, .weight_decay = weight_decay};
    }
    WarmupCosine schedule() const { return {peak_rate, warmup, steps, floor_ratio}; }
};

/// A checkpoint's "key value" lines that a resume must match, in manifest order.
using CharLmSizes = std::vector<std::pair<std::string, std::string>>;

/// The GPT-2-shaped transformer as the trainer uses it. Its parameters' names, shapes and
/// initialisation are models/transformer.hpp's functions of `config`.
struct CharLmGpt2 {
    static constexpr CharLmModel model = CharLmModel::gpt2;
    template <Scalar T>
    using Cache = TransformerMemory<T>;
    TransformerConfig config;

    CharLmGpt2(const CharLmSettings& s, std::size_t vocabulary)
        : config{.vocabulary = vocabulary, .context = s.context, .width = s.width, .heads = s.heads,
                 .layers = s.layers, .kernel = s.kernel, .seed = s.seed} {}

    /// value_error (models/transformer.hpp's) for sizes the model cannot take.
    void check() const { check_transformer_config(config); }

    CharLmSizes sizes() const {
        return {{"layers", fmt::format("{}", config.layers)}, {"width", fmt::format("{}", config.width)},
                {"heads", fmt::format("{}", config.heads)}, {"context", fmt::format("{}", config.context)}};
    }
    template <Scalar T>
    Var<T> loss(std::span<const Var<T>> leaves, std::span<const std::size_t> tokens,
                std::span<const std::size_t> targets, std::size_t batch) const {
        return transformer_loss(TransformerVars<T>::from(leaves, config), config, tokens, targets, batch);
    }
    /// logits [1, n, V] of n tokens continuing the one sequence `cache` holds (which then holds them).
    template <Scalar T>
    Var<T> logits(std::span<const Var<T>> leaves, std::span<const std::size_t> block, Cache<T>& cache) const {
        return transformer_logits(TransformerVars<T>::from(leaves, config), config, block, 1, {.memory = &cache});
    }
};

/// The LLaMA-style decoder as the trainer uses it: RoPE (base 10000, interleaved pairs), RMSNorm
/// (ε = 1e-6), the settings' kv_heads, hidden and tied, the attention kernel the settings name.
/// Its parameters' names, shapes and initialisation are models/llama.hpp's functions of `config`.
struct CharLmLlama {
    static constexpr CharLmModel model = CharLmModel::llama;
    template <Scalar T>
    using Cache = LlamaCache<T>;
    LlamaConfig config;

    CharLmLlama(const CharLmSettings& s, std::size_t vocabulary)
        : config{.vocabulary = vocabulary, .context = s.context, .width = s.width, .heads = s.heads,
                 .kv_heads = s.kv_heads, .layers = s.layers, .hidden = s.hidden, .tied = s.tied,
                 .kernel = s.kernel, .seed = s.seed} {}

    /// value_error (models/llama.hpp's) for sizes the decoder cannot take.
    void check() const { check_llama_config(config); }

    CharLmSizes sizes() const {
        return {{"layers", fmt::format("{}", config.layers)},     {"width", fmt::format("{}", config.width)},
                {"heads", fmt::format("{}", config.heads)},       {"kv_heads", fmt::format("{}", config.kv_heads)},
                {"hidden", fmt::format("{}", config.hidden)},     {"tied", config.tied ? "yes" : "no"},
                {"context", fmt::format("{}", config.context)}};
    }
    template <Scalar T>
    Var<T> loss(std::span<const Var<T>> leaves, std::span<const std::size_t> tokens,
                std::span<const std::size_t> targets, std::size_t batch) const {
        return llama_loss(LlamaVars<T>::from(leaves, config), config, tokens, targets, batch);
    }
    /// logits [1, n, V] of n tokens continuing the one sequence `cache` holds (which then holds them).
    template <Scalar T>
    Var<T> logits(std::span<const Var<T>> leaves, std::span<const std::size_t> block, Cache<T>& cache) const {
        return llama_logits(LlamaVars<T>::from(leaves, config), config, block, 1, &cache);
    }
};

/// The model a trainer trains: one of the families above, chosen by CharLmSettings::model.
using CharLmNetwork = std::variant<CharLmGpt2, CharLmLlama>;

inline CharLmNetwork char_lm_network(const CharLmSettings& s, std::size_t vocabulary) {
    if (s.model == CharLmModel::llama) return CharLmLlama(s, vocabulary);
    return CharLmGpt2(s, vocabulary);
}

inline CharLmModel model_of(const CharLmNetwork& network) {
    return std::visit([](const auto& family) { return family.model; }, network);
}

inline void check_network(const CharLmNetwork& network) {
    std::visit([](const auto& family) { family.check(); }, network);
}

inline std::vector<std::string> parameter_names(const CharLmNetwork& network) {
    return std::visit([](const auto& family) { return parameter_names(family.config); }, network);
}

inline std::vector<Shape> parameter_shapes(const CharLmNetwork& network) {
    return std::visit([](const auto& family) { return parameter_shapes(family.config); }, network);
}

/// The initial parameters (GPT-2's initialisation); throws check_network's value_error for sizes
/// the family cannot take.
inline std::vector<Tensor<double>> initial_parameters(const CharLmNetwork& network) {
    return std::visit([](const auto& family) { return initial_parameters(family.config); }, network);
}

inline CharLmSizes sizes_of(const CharLmNetwork& network) {
    return std::visit([](const auto& family) { return family.sizes(); }, network);
}

/// The number of scalars the parameters hold (a config's parameter_count() counts tensors).
inline std::size_t parameter_values(const CharLmNetwork& network) {
    std::size_t total = 0;
    for (const Shape& shape : parameter_shapes(network)) total += shape.size();
    return total;
}

/// The default corpus: prose files of /usr/share/games/fortunes (Debian package `fortunes`), in
/// this order; the other files there are ASCII art, binary indexes (.dat) or links (.u8).
inline std::vector<std::filesystem::path> default_corpus_files() {
    std::vector<std::filesystem::path> files;
    for (const char* name : {"cookie", "fortunes", "humorists", "literature", "love", "people", "platitudes", "wisdom",
                             "work", "men-women", "education", "food"}) {
        files.push_back(std::filesystem::path("/usr/share/games/fortunes") / name);
    }
    return files;
}

struct Corpus {
    std::string alphabet;  ///< the characters that occur, sorted; token k is alphabet[k]
    std::vector<std::size_t> train, validation;

    std::size_t token_of(char c) const {
        const auto at = std::lower_bound(alphabet.begin(), alphabet.end(), c);
        if (at == alphabet.end() || *at != c) {
            throw value_error(fmt::format("charlm: character {:?} does not occur in the corpus", c));
        }
        return static_cast<std::size_t>(at - alphabet.begin());
    }
};

/// Printable ASCII and newlines; a tab becomes a space; an overstruck character ("_\bx", the
/// fortunes' underlining) keeps only what was struck over it; every other byte is dropped.
inline std::string clean_text(const std::string& raw) {
    std::string text;
    for (const char c : raw) {
        if (c == '\b') {
            if (!text.empty()) text.pop_back();
        } else if (c == '\t') {
            text += ' ';
        } else if (c == '\n' || (c >= ' ' && c <= '~')) {
            text += c;
        }
    }
    return text;
}

/// The files concatenated in the given order and cleaned; every tenth block of 1000 characters
/// (blocks 9, 19, ...) is validation text, the rest training text, so both sample every file.
inline Corpus load_corpus(const std::vector<std::filesystem::path>& files) {
    std::string text;
    for (const auto& path : files) {
        text += clean_text(read_file_bytes(path, "charlm: corpus file"));
    }
    Corpus corpus;
    corpus.alphabet = text;
    std::sort(corpus.alphabet.begin(), corpus.alphabet.end());
    corpus.alphabet.erase(std::unique(corpus.alphabet.begin(), corpus.alphabet.end()), corpus.alphabet.end());
    for (std::size_t k = 0; k < text.size(); ++k) {
        (k / 1000 % 10 == 9 ? corpus.validation : corpus.train).push_back(corpus.token_of(text[k]));
    }
    return corpus;
}

/// B windows of T + 1 characters: tokens are the first T, targets the last T.
struct CharBatch {
    std::size_t size = 0;
    std::vector<std::size_t> tokens, targets;
};

inline CharBatch windows_at(const std::vector<std::size_t>& text, std::span<const std::size_t> starts, std::size_t T) {
    CharBatch batch{starts.size(), {}, {}};
    for (const std::size_t start : starts) {
        batch.tokens.insert(batch.tokens.end(), text.begin() + static_cast<std::ptrdiff_t>(start),
                            text.begin() + static_cast<std::ptrdiff_t>(start + T));
        batch.targets.insert(batch.targets.end(), text.begin() + static_cast<std::ptrdiff_t>(start + 1),
                             text.begin() + static_cast<std::ptrdiff_t>(start + T + 1));
    }
    return batch;
}

/// The training batch of step `step`: B random windows, from a generator seeded by (seed, step)
/// through std::seed_seq (its algorithm is specified, so every standard library draws the same).
inline CharBatch training_batch(const Corpus& corpus, const CharLmSettings& s, std::size_t step) {
    if (corpus.train.size() <= s.context + 1) throw value_error("charlm: the training text is shorter than one window");
    std::seed_seq seeds{static_cast<std::uint64_t>(s.seed), static_cast<std::uint64_t>(step)};
    std::mt19937_64 generator(seeds);
    std::vector<std::size_t> starts(s.batch);
    for (std::size_t& start : starts) start = generator() % (corpus.train.size() - s.context - 1);
    return windows_at(corpus.train, starts, s.context);
}

/// The scalar type a run trains in, by its NumPy name (the checkpoint's dtype, --dtype).
template <std::floating_point T>
constexpr std::string_view dtype_name() {
    return std::is_same_v<T, float> ? "float32" : "float64";
}

/// T = double or float: the parameters, their gradients (the tape is a Tape<T>) and Adam's moments
/// are all T, as in PyTorch's float32 training (models/optimizer.hpp says which scalars stay
/// double). Losses are returned, and validation losses summed, in double. A float trainer starts
/// from the double initialisation rounded to float, so both types start from the same draw. The
/// model is the family settings.model names; everything else is the same for both.
template <std::floating_point T>
class BasicCharLmTrainer {
public:
    BasicCharLmTrainer(const CharLmSettings& settings, const Corpus& corpus)
        : settings_(settings),
          corpus_(corpus),
          network_(char_lm_network(settings, corpus.alphabet.size())),
          names_(parameter_names(network_)),
          parameters_(initial(network_)),
          adam_(settings.adam()) {
        if (settings.micro_batches == 0 || settings.micro_batches > settings.batch) {
            throw value_error(fmt::format("charlm: micro_batches is {}; it must be 1 to the batch size ({})",
                                          settings.micro_batches, settings.batch));
        }
        for (std::size_t part = 0; part < settings.micro_batches; ++part) {
            tapes_.emplace_back().set_product_precision(settings.products);  // throws for bfloat16 unless float
        }
    }

    /// The run's type as checkpoints and --dtype name it: float64, float32, or bfloat16 (a float
    /// trainer whose products read bfloat16; its parameters are float32).
    std::string_view dtype() const {
        return settings_.products == ProductPrecision::bfloat16 ? std::string_view("bfloat16") : dtype_name<T>();
    }

    /// One AdamW step on the batch of step number steps_done(); returns the loss before it.
    double step() {
        const std::size_t s = adam_.steps();
        const double loss = forward_backward(training_batch(corpus_, settings_, s));
        last_norm_ = clip_by_global_norm(gradient_pointers_, settings_.clip_norm);
        adam_.set_learning_rate(settings_.schedule().rate(s));  // double; Adam rounds what it applies
        std::vector<Tensor<T>*> parameters;
        for (Tensor<T>& p : parameters_) parameters.push_back(&p);
        std::vector<const Tensor<T>*> gradients(gradient_pointers_.begin(), gradient_pointers_.end());
        adam_.step(parameters, gradients);
        return loss;
    }

    /// Mean loss (nats per character) over consecutive windows of the validation text, at most
    /// `max_windows` of them spread evenly over it (0: all). Each batch's loss is computed in T, the
    /// mean over batches in double.
    double validation_loss(std::size_t max_windows = 0) {
        const std::size_t context = settings_.context, available = (corpus_.validation.size() - 1) / context;
        const std::size_t count = max_windows == 0 ? available : std::min(available, max_windows);
        double total = 0;
        for (std::size_t first = 0; first < count; first += settings_.batch) {
            std::vector<std::size_t> starts;
            for (std::size_t w = first; w < std::min(count, first + settings_.batch); ++w) {
                starts.push_back(w * available / count * context);
            }
            const CharBatch batch = windows_at(corpus_.validation, starts, context);
            const std::vector<Var<T>> leaves = record_parameters(tapes_.front());
            total += static_cast<double>(starts.size()) *
                     static_cast<double>(mean_loss(leaves, std::span<const std::size_t>(batch.tokens),
                                                   std::span<const std::size_t>(batch.targets), batch.size)
                                             .value()
                                             .item());
        }
        return total / static_cast<double>(count);
    }

    std::size_t steps_done() const { return adam_.steps(); }
    double last_gradient_norm() const { return last_norm_; }
    const std::vector<Tensor<T>>& parameters() const { return parameters_; }
    const CharLmNetwork& network() const { return network_; }
    /// The model's config: TransformerConfig (the default: a GPT-2 trainer's, as before the
    /// decoder) or LlamaConfig; asking for the other family's throws usage_error.
    template <class Config = TransformerConfig>
    const Config& config() const {
        const Config* found = std::visit(
            [](const auto& family) -> const Config* {
                if constexpr (std::is_same_v<std::remove_cvref_t<decltype(family.config)>, Config>) {
                    return &family.config;
                } else {
                    return nullptr;
                }
            },
            network_);
        if (found == nullptr) {
            throw usage_error(fmt::format("charlm: config() asked for another family's config than this trainer's "
                                          "model, {}",
                                          char_lm_model_name(model_of(network_))));
        }
        return *found;
    }
    /// The tape of the last step as it ran (graph, values, gradients) and its loss J, until the next
    /// step or validation clears it: what check_gradients(tape, J) checks in place. With several
    /// micro-batches, the first one's tape and its mean loss.
    const Tape<T>& last_step_tape() const { return tapes_.front(); }
    Var<T> last_step_loss() const { return losses_.front(); }

    void save(const std::filesystem::path& directory) const;
    /// Resumes from the checkpoint `directory` names (see find_checkpoint: the directory itself, or
    /// what an interrupted save left beside it); returns the directory actually read.
    std::filesystem::path load(const std::filesystem::path& directory);
    std::string sample(const std::string& prompt, std::size_t length, std::uint64_t seed, double temperature = 1.0);

private:
    static std::vector<Tensor<T>> initial(const CharLmNetwork& network) {
        if constexpr (std::is_same_v<T, double>) {
            return initial_parameters(network);
        } else {
            std::vector<Tensor<T>> rounded;
            for (const Tensor<double>& p : initial_parameters(network)) rounded.push_back(tensor_cast<T>(p));
            return rounded;
        }
    }
    /// The parameters as named leaves of `tape`, cleared (copied as they are: no conversion).
    std::vector<Var<T>> record_parameters(Tape<T>& tape) const {
        tape.clear();
        std::vector<Var<T>> leaves;
        for (std::size_t i = 0; i < parameters_.size(); ++i) leaves.push_back(tape.leaf(parameters_[i], names_[i]));
        return leaves;
    }
    /// The family's mean next-token loss of B sequences, from the leaves record_parameters made.
    Var<T> mean_loss(std::span<const Var<T>> leaves, std::span<const std::size_t> tokens,
                     std::span<const std::size_t> targets, std::size_t batch) const {
        return std::visit([&](const auto& family) { return family.loss(leaves, tokens, targets, batch); }, network_);
    }
    double forward_backward(const CharBatch& batch);
    template <class Family>
    std::string sample_from(const Family& family, const std::string& prompt, std::size_t length, std::uint64_t seed,
                            double temperature);

    CharLmSettings settings_;
    const Corpus& corpus_;
    CharLmNetwork network_;
    std::vector<std::string> names_;  ///< the parameters' names, in their order
    std::vector<Tensor<T>> parameters_;
    BasicAdam<T> adam_;
    std::deque<Tape<T>> tapes_;  ///< one per micro-batch (tapes do not move: a deque keeps them in place)
    std::vector<Var<T>> losses_;
    std::vector<Tensor<T>> gradients_;
    std::vector<Tensor<T>*> gradient_pointers_;
    double last_norm_ = 0;
};

/// The double trainer, as every caller before float training named it.
using CharLmTrainer = BasicCharLmTrainer<double>;

/// The batch's mean loss; its gradients, in parameter order, left in the trainer's own buffers
/// (clipping scales them). Part p of P holds sequences
/// [p·B/P, (p+1)·B/P); its mean loss J_p and gradient g_p weigh by its share of the sequences,
/// w_p = B_p/B (0.5 each for 16 in two: exact), so J = Σ w_p J_p and g = Σ w_p g_p, summed in part
/// order whatever thread ran which part. One part: w = 1, the tape's own gradient.
template <std::floating_point T>
double BasicCharLmTrainer<T>::forward_backward(const CharBatch& batch) {
    const std::size_t parts = tapes_.size(), context = settings_.context;
    const auto first_sequence = [&](std::size_t part) { return part * batch.size / parts; };
    std::vector<std::vector<Var<T>>> leaves(parts);
    losses_.assign(parts, Var<T>{});
    parallel_for(parts, [&](std::size_t part, unsigned) {
        const std::size_t first = first_sequence(part), count = first_sequence(part + 1) - first;
        leaves[part] = record_parameters(tapes_[part]);
        const auto window = [&](const std::vector<std::size_t>& v) {
            return std::span<const std::size_t>(v).subspan(first * context, count * context);
        };
        losses_[part] = mean_loss(leaves[part], window(batch.tokens), window(batch.targets), count);
        tapes_[part].backward(losses_[part]);
    });
    gradients_.resize(parameters_.size());
    gradient_pointers_.clear();
    double loss = 0;
    for (std::size_t part = 0; part < parts; ++part) {
        const std::size_t count = first_sequence(part + 1) - first_sequence(part);
        const T weight = static_cast<T>(count) / static_cast<T>(batch.size);
        loss += static_cast<double>(weight) * static_cast<double>(losses_[part].value().item());
        for (std::size_t i = 0; i < gradients_.size(); ++i) {
            const std::span<const T> g = leaves[part][i].grad().data();
            if (part == 0) gradients_[i] = leaves[part][i].grad();
            const std::span<T> sum = gradients_[i].data();
            for (std::size_t k = 0; k < sum.size(); ++k) sum[k] = part == 0 ? weight * g[k] : sum[k] + weight * g[k];
        }
    }
    for (Tensor<T>& g : gradients_) gradient_pointers_.push_back(&g);
    return loss;
}

namespace charlm_files {

inline std::string hex(const std::string& text) {
    std::string out;
    for (const unsigned char c : text) out += fmt::format("{:02x}", c);
    return out;
}

/// The manifest: format line, step count, the alphabet, the model family and its sizes, the scalar
/// type, then one line per parameter. A checkpoint written before float training has no dtype
/// line (float64), one written before the decoder no model line (gpt2).
inline std::string manifest(const CharLmNetwork& network, const std::string& alphabet, std::size_t steps,
                            std::string_view dtype) {
    std::string text = fmt::format("tapegrad-charlm-checkpoint 1\nsteps_done {}\nalphabet {}\nmodel {}\n", steps,
                                   hex(alphabet), char_lm_model_name(model_of(network)));
    for (const auto& [key, value] : sizes_of(network)) text += fmt::format("{} {}\n", key, value);
    text += fmt::format("dtype {}\n", dtype);
    const std::vector<std::string> names = parameter_names(network);
    const std::vector<Shape> shapes = parameter_shapes(network);
    for (std::size_t i = 0; i < names.size(); ++i) text += fmt::format("parameter {} {}\n", names[i], shapes[i].to_string());
    return text;
}

/// The manifest's "key value" lines as a map (parameter lines are checked through the shapes).
inline std::map<std::string, std::string> read_manifest(const std::filesystem::path& directory) {
    std::ifstream file(directory / "manifest.txt");
    if (!file) throw io_error(fmt::format("charlm: no checkpoint in '{}' (manifest.txt missing)", directory.string()));
    std::map<std::string, std::string> fields;
    std::string key, value;
    while (file >> key && std::getline(file >> std::ws, value)) fields[key == "parameter" ? key + " " + value : key] = value;
    if (!fields.contains("tapegrad-charlm-checkpoint")) {
        throw io_error(fmt::format("charlm: '{}' is not a tapegrad char-LM checkpoint", (directory / "manifest.txt").string()));
    }
    return fields;
}

/// The manifest's value for `key`; an io_error naming the key when it lacks it.
inline std::string field_of(const std::map<std::string, std::string>& fields, const std::string& key) {
    const auto at = fields.find(key);
    if (at == fields.end()) throw io_error(fmt::format("charlm: checkpoint manifest lacks '{}'", key));
    return at->second;
}

/// Refuses (value_error, naming the checkpoint's and this run's) a checkpoint of another model
/// family, other sizes, another corpus (alphabet) or another scalar type; io_error for a manifest
/// that lacks one of the sizes. No silent conversion: a float64 run resumed in float32 would not be
/// the run it claims to continue (convert the .npy files explicitly if that is what is wanted).
inline void require_same_run(const std::filesystem::path& directory, const std::map<std::string, std::string>& fields,
                             const CharLmNetwork& network, const std::string& alphabet, std::string_view dtype) {
    const auto field = [&](const std::string& key) { return field_of(fields, key); };
    const std::string_view model = char_lm_model_name(model_of(network));
    const std::string saved_model = fields.contains("model") ? fields.at("model") : "gpt2";
    if (saved_model != model) {
        throw value_error(fmt::format("charlm: checkpoint '{}' holds the {} model, this run trains the {} model: "
                                      "resume it with --model {}",
                                      directory.string(), saved_model, model, saved_model));
    }
    std::string expected, found;
    for (const auto& [key, value] : sizes_of(network)) {
        expected += fmt::format("{} {}, ", key, value);
        found += fmt::format("{} {}, ", key, field(key));
    }
    expected += "alphabet " + hex(alphabet);
    found += "alphabet " + field("alphabet");
    if (found != expected) {
        throw value_error(fmt::format("charlm: checkpoint '{}' is for another model or corpus (checkpoint: {} {}; "
                                      "this run: {} {})",
                                      directory.string(), saved_model, found, model, expected));
    }
    const std::string saved_dtype = fields.contains("dtype") ? fields.at("dtype") : "float64";
    if (saved_dtype != dtype) {
        // bfloat16 runs keep float32 parameters and moments; their products read bfloat16.
        const auto held = [](std::string_view d) {
            return d == "bfloat16" ? std::string("float32 parameters and moments of a bfloat16 run")
                                   : fmt::format("{} parameters and moments", d);
        };
        throw value_error(fmt::format("charlm: checkpoint '{}' holds {}, this run trains in {}: resume it with --dtype {}",
                                      directory.string(), held(saved_dtype), dtype, saved_dtype));
    }
}

/// Test-only hook for examples/charlm_kill_resume.py, which must SIGKILL a save at a known moment:
/// with `TAPEGRAD_CHARLM_TEST_PAUSE=<steps>:<point>` in the environment, the save of the checkpoint
/// after `<steps>` steps stops at `<point>`, "files" (half of the files written into DIR.partial) or
/// "renamed" (DIR renamed to DIR.previous, DIR.partial not yet renamed to DIR), announces it on
/// standard error (`charlm test pause: <point> at step <steps>`) and sleeps 20 s, or the
/// milliseconds of a third field (`<steps>:<point>:<ms>`: tests/test_checkpoints.cpp removes
/// DIR.partial meanwhile to make the second rename fail), then goes on (so a test that dies first
/// leaves no process asleep for ever). Unset, a save costs one getenv.
inline void test_pause(std::string_view point, std::size_t steps) {
    const char* setting = std::getenv("TAPEGRAD_CHARLM_TEST_PAUSE");
    const std::string ours = fmt::format("{}:{}", steps, point);
    if (setting == nullptr || !std::string_view(setting).starts_with(ours)) return;
    const std::string_view rest = std::string_view(setting).substr(ours.size());
    unsigned milliseconds = 20000;
    if (!rest.empty()) {  // ":<ms>", or another point whose name begins with this one's
        const char* last = rest.data() + rest.size();
        if (rest[0] != ':' || std::from_chars(rest.data() + 1, last, milliseconds).ptr != last) return;
    }
    fmt::print(stderr, "charlm test pause: {} at step {}\n", point, steps);
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds));
}

inline bool complete(const std::filesystem::path& directory) {
    std::error_code ignored;
    return std::filesystem::is_regular_file(directory / "manifest.txt", ignored);
}

}  // namespace charlm_files

/// The checkpoint to resume from for the name `directory`. A save (below) writes DIR.partial,
/// manifest last, then renames DIR to DIR.previous and DIR.partial to DIR, and only then removes
/// DIR.previous. So a complete DIR.partial (its manifest, written last, is there) is the newest
/// checkpoint on disk: the last save's, killed after its files and before its second rename (beside
/// the DIR it was about to replace, or, killed between the two renames, beside that DIR gone to
/// DIR.previous); DIR is newer than DIR.previous, which was DIR before it. So: a complete
/// DIR.partial, else DIR when its manifest is there, else a complete DIR.previous. This holds
/// against the process being killed, not the machine losing power: nothing is fsync'ed.
inline std::filesystem::path find_checkpoint(const std::filesystem::path& directory) {
    for (const std::string suffix : {".partial", "", ".previous"}) {
        const std::filesystem::path candidate = directory.string() + suffix;
        if (charlm_files::complete(candidate)) return candidate;
    }
    throw io_error(fmt::format("charlm: no checkpoint in '{0}' (nor a complete '{0}.partial' or '{0}.previous' "
                               "left by an interrupted save)",
                               directory.string()));
}

/// Writes the parameters, Adam's moments and the manifest into `directory`, atomically as a whole:
/// everything goes into "<directory>.partial" first (each file through write_file_atomically,
/// the manifest last), which then replaces `directory` by renames. A save killed at any point leaves
/// a checkpoint find_checkpoint finds: first, what an earlier interrupted save left is settled (a
/// complete DIR.partial, the newest, made DIR as a save would; else a complete DIR.previous renamed
/// to DIR when DIR is not complete), so that clearing DIR.partial never deletes the only or the
/// newest complete checkpoint. A save that fails (an exception) leaves the previous checkpoint in
/// place and removes the partial one. A float32 run writes float32 files (a bfloat16 run too: its
/// parameters and moments are float32).
template <std::floating_point T>
void BasicCharLmTrainer<T>::save(const std::filesystem::path& directory) const {
    namespace fs = std::filesystem;
    const fs::path partial = directory.string() + ".partial", previous = directory.string() + ".previous";
    constexpr NpyDtype file_dtype = std::is_same_v<T, float> ? NpyDtype::float32 : NpyDtype::float64;
    // Each step atomic or on an older or incomplete copy: killed here, the state is still one of the above.
    if (charlm_files::complete(partial)) {
        fs::remove_all(previous);
        if (fs::exists(directory)) fs::rename(directory, previous);
        fs::rename(partial, directory);
    } else if (!charlm_files::complete(directory) && charlm_files::complete(previous)) {
        fs::remove_all(directory);
        fs::rename(previous, directory);
    }
    try {
        fs::remove_all(partial);
        fs::create_directories(partial);
        const auto& state = adam_.state();
        for (std::size_t i = 0; i < names_.size(); ++i) {
            const Tensor<T> zero(parameters_[i].shape());
            write_file_atomically((partial / ("param." + names_[i] + ".npy")).string(),
                                  npy_bytes(parameters_[i], file_dtype), "charlm");
            write_file_atomically((partial / ("adam_m." + names_[i] + ".npy")).string(),
                                  npy_bytes(state.first.empty() ? zero : state.first[i], file_dtype), "charlm");
            write_file_atomically((partial / ("adam_v." + names_[i] + ".npy")).string(),
                                  npy_bytes(state.second.empty() ? zero : state.second[i], file_dtype), "charlm");
            if (i + 1 == names_.size() / 2) charlm_files::test_pause("files", adam_.steps());
        }
        write_file_atomically((partial / "manifest.txt").string(),
                              charlm_files::manifest(network_, corpus_.alphabet, adam_.steps(), dtype()),
                              "charlm");
        fs::remove_all(previous);
        if (fs::exists(directory)) fs::rename(directory, previous);
        charlm_files::test_pause("renamed", adam_.steps());
        fs::rename(partial, directory);
        fs::remove_all(previous);
    } catch (...) {
        std::error_code ignored;
        fs::remove_all(partial, ignored);
        if (!fs::exists(directory, ignored) && fs::exists(previous, ignored)) fs::rename(previous, directory, ignored);
        throw;
    }
}

/// Reads the checkpoint find_checkpoint(directory) finds; refuses one of another model family or
/// size, alphabet or scalar type (charlm_files::require_same_run).
template <std::floating_point T>
std::filesystem::path BasicCharLmTrainer<T>::load(const std::filesystem::path& requested) {
    const std::filesystem::path directory = find_checkpoint(requested);
    const auto fields = charlm_files::read_manifest(directory);
    charlm_files::require_same_run(directory, fields, network_, corpus_.alphabet, dtype());
    const NpyDtype expected_dtype = std::is_same_v<T, float> ? NpyDtype::float32 : NpyDtype::float64;
    const auto read = [&](const std::filesystem::path& file) {
        const std::string bytes = read_file_bytes(file, "charlm");
        const std::string source = fmt::format("'{}'", file.string());
        if (parse_npy_header(bytes, source).dtype != expected_dtype) {
            throw value_error(
                fmt::format("charlm: '{}' is not {} as its manifest says", file.string(),
                            dtype_name<T>()));
        }
        return parse_npy<T>(bytes, source);
    };
    BasicAdamState<T> state;
    state.steps = std::stoul(charlm_files::field_of(fields, "steps_done"));
    std::vector<Tensor<T>> loaded;
    for (std::size_t i = 0; i < names_.size(); ++i) {
        loaded.push_back(read(directory / ("param." + names_[i] + ".npy")));
        state.first.push_back(read(directory / ("adam_m." + names_[i] + ".npy")));
        state.second.push_back(read(directory / ("adam_v." + names_[i] + ".npy")));
        if (!(loaded[i].shape() == parameters_[i].shape())) {
            throw value_error(fmt::format("charlm: checkpoint parameter {} is {}, the model needs {}", names_[i],
                                          loaded[i].shape().to_string(), parameters_[i].shape().to_string()));
        }
    }
    parameters_ = std::move(loaded);
    adam_.restore(state.steps == 0 ? BasicAdamState<T>{} : std::move(state));
    return directory;
}

/// `length` characters after `prompt`, each drawn from softmax(logits / temperature) with a
/// generator seeded by `seed`. The prompt goes through the model as one block, then every new
/// character as a block of one, through the family's cache (positions continue from the
/// characters held). When the context is full, the cache starts again from the last half of the
/// context. The logits are T; the drawing is done in double.
template <std::floating_point T>
std::string BasicCharLmTrainer<T>::sample(const std::string& prompt, std::size_t length, std::uint64_t seed,
                                          double temperature) {
    return std::visit([&](const auto& family) { return sample_from(family, prompt, length, seed, temperature); },
                      network_);
}

template <std::floating_point T>
template <class Family>
std::string BasicCharLmTrainer<T>::sample_from(const Family& family, const std::string& prompt, std::size_t length,
                                               std::uint64_t seed, double temperature) {
    std::mt19937_64 generator(seed);
    std::vector<std::size_t> history;
    for (const char c : clean_text(prompt)) history.push_back(corpus_.token_of(c));
    if (history.empty()) history.push_back(corpus_.token_of('\n'));
    std::string text;
    const std::size_t context = settings_.context, V = corpus_.alphabet.size();
    typename Family::template Cache<T> cache;
    std::vector<std::size_t> block(history.end() - static_cast<std::ptrdiff_t>(std::min(history.size(), context - 1)),
                                   history.end());
    for (std::size_t n = 0; n < length; ++n) {
        if (cache.length + block.size() > context) {
            cache = {};
            block.assign(history.end() - static_cast<std::ptrdiff_t>(context / 2), history.end());
        }
        const std::vector<Var<T>> leaves = record_parameters(tapes_.front());
        const Tensor<T> logits =
            family.logits(std::span<const Var<T>>(leaves), std::span<const std::size_t>(block), cache).value();
        const std::size_t last = (block.size() - 1) * V;
        const auto logit = [&](std::size_t v) { return static_cast<double>(logits[last + v]); };
        double largest = logit(0), total = 0;
        for (std::size_t v = 0; v < V; ++v) largest = std::max(largest, logit(v));
        std::vector<double> weights(V);
        for (std::size_t v = 0; v < V; ++v) total += weights[v] = std::exp((logit(v) - largest) / temperature);
        double u = static_cast<double>(generator() >> 11) * 0x1.0p-53 * total;
        std::size_t next = 0;
        while (next + 1 < V && u >= weights[next]) u -= weights[next++];
        history.push_back(next);
        text += corpus_.alphabet[next];
        block = {next};
    }
    return text;
}

}  // namespace tapegrad
