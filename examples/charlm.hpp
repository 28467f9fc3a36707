// A character-level language model on real text: the transformer of models/transformer.hpp
// trained with AdamW, warm-up + cosine decay and global-norm clipping (models/optimizer.hpp) on
// text from Debian's `fortunes` package. The pieces examples/train_charlm.cpp and the tests use:
//   * CharLmSettings: the model size and the training schedule (typed, with their defaults);
//   * Corpus: plain-text files read in the given order, cleaned, split into training and
//     validation text, encoded over the alphabet of characters that occur;
//   * CharLmTrainer: parameters, optimizer, one reused tape; a step on the batch of a given step
//     number (drawn from a generator seeded by (seed, step), so a resumed run draws the same
//     batches), the validation loss, checkpoints (one .npy per parameter and per Adam moment,
//     plus a manifest, written atomically) and sampling from a prompt through the memory path.
#pragma once

#include "io/npy.hpp"
#include "models/optimizer.hpp"
#include "models/transformer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace tapegrad {

struct CharLmSettings {
    std::size_t layers = 2;
    std::size_t width = 64;
    std::size_t heads = 4;
    std::size_t context = 64;   // T: characters per training sequence
    std::size_t batch = 16;     // sequences per step
    std::size_t steps = 6000;   // S: the schedule's length
    std::size_t warmup = 200;   // W
    double peak_rate = 1e-2;    // 3e-3 reached 2.74 bits/char in 2000 steps; see the README
    double floor_ratio = 0.1;   // the cosine decays to peak_rate·floor_ratio
    double weight_decay = 0.1;  // λ, on matrices only (DecayScope::matrices)
    double clip_norm = 1.0;     // global gradient norm cap
    double beta2 = 0.99;        // nanoGPT's choice for small character models
    std::uint64_t seed = 1;     // initialisation and batches
    // The same function either way (tests/test_transformer.cpp holds them together); fused keeps no
    // T×T score matrices on the tape and trains faster (bench_charlm prints both).
    AttentionKernel kernel = AttentionKernel::fused;

    TransformerConfig model(std::size_t vocabulary) const {
        TransformerConfig c;
        c.vocabulary = vocabulary;
        c.context = context;
        c.width = width;
        c.heads = heads;
        c.layers = layers;
        c.seed = seed;
        c.kernel = kernel;
        return c;
    }
    AdamSettings adam() const {
        return AdamSettings{.learning_rate = peak_rate, .beta2 = beta2, .weight_decay = weight_decay};
    }
    WarmupCosine schedule() const { return {peak_rate, warmup, steps, floor_ratio}; }
};

// The default corpus: prose files of /usr/share/games/fortunes (Debian package `fortunes`), in
// this order; the other files there are ASCII art, binary indexes (.dat) or links (.u8).
inline std::vector<std::filesystem::path> default_corpus_files() {
    std::vector<std::filesystem::path> files;
    for (const char* name : {"cookie", "fortunes", "humorists", "literature", "love", "people", "platitudes", "wisdom",
                             "work", "men-women", "education", "food"}) {
        files.push_back(std::filesystem::path("/usr/share/games/fortunes") / name);
    }
    return files;
}

struct Corpus {
    std::string alphabet;  // the characters that occur, sorted; token k is alphabet[k]
    std::vector<std::size_t> train, validation;

    std::size_t token_of(char c) const {
        const auto at = std::lower_bound(alphabet.begin(), alphabet.end(), c);
        if (at == alphabet.end() || *at != c) {
            throw value_error(fmt::format("charlm: character {:?} does not occur in the corpus", c));
        }
        return static_cast<std::size_t>(at - alphabet.begin());
    }
};

// Printable ASCII and newlines; a tab becomes a space; an overstruck character ("_\bx", the
// fortunes' underlining) keeps only what was struck over it; every other byte is dropped.
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

// The files concatenated in the given order and cleaned; every tenth block of 1000 characters
// (blocks 9, 19, ...) is validation text, the rest training text, so both sample every file.
inline Corpus load_corpus(const std::vector<std::filesystem::path>& files) {
    std::string text;
    for (const auto& path : files) {
        std::ifstream file(path, std::ios::binary);
        if (!file) throw io_error(fmt::format("charlm: cannot read corpus file '{}'", path.string()));
        text += clean_text(std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()));
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

// B windows of T + 1 characters: tokens are the first T, targets the last T.
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

// The training batch of step `step`: B random windows, from a generator seeded by (seed, step)
// through std::seed_seq (its algorithm is specified, so every standard library draws the same).
inline CharBatch training_batch(const Corpus& corpus, const CharLmSettings& s, std::size_t step) {
    if (corpus.train.size() <= s.context + 1) throw value_error("charlm: the training text is shorter than one window");
    std::seed_seq seeds{static_cast<std::uint64_t>(s.seed), static_cast<std::uint64_t>(step)};
    std::mt19937_64 generator(seeds);
    std::vector<std::size_t> starts(s.batch);
    for (std::size_t& start : starts) start = generator() % (corpus.train.size() - s.context - 1);
    return windows_at(corpus.train, starts, s.context);
}

class CharLmTrainer {
public:
    CharLmTrainer(const CharLmSettings& settings, const Corpus& corpus)
        : settings_(settings), corpus_(corpus), config_(settings.model(corpus.alphabet.size())),
          parameters_(initial_parameters(config_)), adam_(settings.adam()) {}

    // One AdamW step on the batch of step number steps_done(); returns the loss before it.
    double step() {
        const std::size_t s = adam_.steps();
        const CharBatch batch = training_batch(corpus_, settings_, s);
        tape_.clear();  // nodes' buffers are reused by the next graph
        const auto vars = TransformerVars<double>::record(tape_, parameters_, config_);
        const Var<double> J = transformer_loss(vars, config_, std::span<const std::size_t>(batch.tokens),
                                               std::span<const std::size_t>(batch.targets), batch.size);
        tape_.backward(J);
        loss_ = J;
        copy_gradients(vars);
        last_norm_ = clip_by_global_norm(gradient_pointers_, settings_.clip_norm);
        adam_.set_learning_rate(settings_.schedule().rate(s));
        std::vector<Tensor<double>*> parameters;
        for (Tensor<double>& p : parameters_) parameters.push_back(&p);
        std::vector<const Tensor<double>*> gradients(gradient_pointers_.begin(), gradient_pointers_.end());
        adam_.step(parameters, gradients);
        return J.value().item();
    }

    // Mean loss (nats per character) over consecutive windows of the validation text, at most
    // `max_windows` of them spread evenly over it (0: all).
    double validation_loss(std::size_t max_windows = 0) {
        const std::size_t T = settings_.context, available = (corpus_.validation.size() - 1) / T;
        const std::size_t count = max_windows == 0 ? available : std::min(available, max_windows);
        double total = 0;
        for (std::size_t first = 0; first < count; first += settings_.batch) {
            std::vector<std::size_t> starts;
            for (std::size_t w = first; w < std::min(count, first + settings_.batch); ++w) {
                starts.push_back(w * available / count * T);
            }
            const CharBatch batch = windows_at(corpus_.validation, starts, T);
            tape_.clear();
            const auto vars = TransformerVars<double>::record(tape_, parameters_, config_);
            total += static_cast<double>(starts.size()) *
                     transformer_loss(vars, config_, std::span<const std::size_t>(batch.tokens),
                                      std::span<const std::size_t>(batch.targets), batch.size)
                         .value()
                         .item();
        }
        return total / static_cast<double>(count);
    }

    std::size_t steps_done() const { return adam_.steps(); }
    double last_gradient_norm() const { return last_norm_; }
    const std::vector<Tensor<double>>& parameters() const { return parameters_; }
    const TransformerConfig& config() const { return config_; }
    // The tape of the last step as it ran (graph, values, gradients) and its loss J, until the next
    // step or validation clears it: what check_gradients(tape, J) checks in place.
    const Tape<double>& last_step_tape() const { return tape_; }
    Var<double> last_step_loss() const { return loss_; }

    void save(const std::filesystem::path& directory) const;
    void load(const std::filesystem::path& directory);
    std::string sample(const std::string& prompt, std::size_t length, std::uint64_t seed, double temperature = 1.0);

private:
    void copy_gradients(const TransformerVars<double>& vars);

    CharLmSettings settings_;
    const Corpus& corpus_;
    TransformerConfig config_;
    std::vector<Tensor<double>> parameters_;
    Adam adam_;
    Tape<double> tape_;
    Var<double> loss_;
    std::vector<Tensor<double>> gradients_;
    std::vector<Tensor<double>*> gradient_pointers_;
    double last_norm_ = 0;
};

// The leaves' gradients, in parameter order, into the trainer's own buffers (clipping scales them).
inline void CharLmTrainer::copy_gradients(const TransformerVars<double>& vars) {
    const std::vector<Var<double>> leaves = vars.all();
    gradients_.resize(leaves.size());
    gradient_pointers_.clear();
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        gradients_[i] = leaves[i].grad();
        gradient_pointers_.push_back(&gradients_[i]);
    }
}

namespace charlm_files {

// `bytes` into `path` through a temporary file and a rename: `path` holds either its old content
// or all of the new, never a part.
inline void write_atomically(const std::filesystem::path& path, const std::string& bytes) {
    const std::filesystem::path temporary = path.string() + ".tmp";
    {
        std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
        file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        file.close();
        if (!file) {
            std::filesystem::remove(temporary);
            throw io_error(fmt::format("charlm: cannot write '{}'", temporary.string()));
        }
    }
    std::filesystem::rename(temporary, path);
}

inline std::string hex(const std::string& text) {
    std::string out;
    for (const unsigned char c : text) out += fmt::format("{:02x}", c);
    return out;
}

inline std::string unhex(const std::string& digits) {
    std::string out;
    for (std::size_t k = 0; k + 1 < digits.size(); k += 2) out += static_cast<char>(std::stoi(digits.substr(k, 2), nullptr, 16));
    return out;
}

// The manifest: format line, step count, the alphabet, the model size, then one line per parameter.
inline std::string manifest(const TransformerConfig& c, const std::string& alphabet, std::size_t steps) {
    std::string text = fmt::format("tapegrad-charlm-checkpoint 1\nsteps_done {}\nalphabet {}\nlayers {}\nwidth {}\n"
                                   "heads {}\ncontext {}\n",
                                   steps, hex(alphabet), c.layers, c.width, c.heads, c.context);
    const std::vector<std::string> names = parameter_names(c);
    const std::vector<Shape> shapes = parameter_shapes(c);
    for (std::size_t i = 0; i < names.size(); ++i) text += fmt::format("parameter {} {}\n", names[i], shapes[i].to_string());
    return text;
}

// The manifest's "key value" lines as a map (parameter lines are checked through the shapes).
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

}  // namespace charlm_files

// Writes the parameters, Adam's moments and the manifest into `directory`, atomically as a whole:
// everything goes into "<directory>.partial" first, which then replaces `directory` by renames. A
// run that fails while saving leaves the previous checkpoint in place and removes the partial one.
inline void CharLmTrainer::save(const std::filesystem::path& directory) const {
    namespace fs = std::filesystem;
    const fs::path partial = directory.string() + ".partial", previous = directory.string() + ".previous";
    try {
        fs::remove_all(partial);
        fs::create_directories(partial);
        const std::vector<std::string> names = parameter_names(config_);
        const AdamState& state = adam_.state();
        for (std::size_t i = 0; i < names.size(); ++i) {
            const Tensor<double> zero(parameters_[i].shape());
            charlm_files::write_atomically(partial / ("param." + names[i] + ".npy"), npy_bytes(parameters_[i]));
            charlm_files::write_atomically(partial / ("adam_m." + names[i] + ".npy"), npy_bytes(state.first.empty() ? zero : state.first[i]));
            charlm_files::write_atomically(partial / ("adam_v." + names[i] + ".npy"), npy_bytes(state.second.empty() ? zero : state.second[i]));
        }
        charlm_files::write_atomically(partial / "manifest.txt", charlm_files::manifest(config_, corpus_.alphabet, adam_.steps()));
        fs::remove_all(previous);
        if (fs::exists(directory)) fs::rename(directory, previous);
        fs::rename(partial, directory);
        fs::remove_all(previous);
    } catch (...) {
        std::error_code ignored;
        fs::remove_all(partial, ignored);
        throw;
    }
}

// Reads a checkpoint written by save; refuses one of another model size or alphabet.
inline void CharLmTrainer::load(const std::filesystem::path& directory) {
    const auto fields = charlm_files::read_manifest(directory);
    const auto field = [&](const std::string& key) {
        const auto at = fields.find(key);
        if (at == fields.end()) throw io_error(fmt::format("charlm: checkpoint manifest lacks '{}'", key));
        return at->second;
    };
    const std::string expected = fmt::format("{} {} {} {} {}", config_.layers, config_.width, config_.heads,
                                             config_.context, charlm_files::hex(corpus_.alphabet));
    const std::string found = fmt::format("{} {} {} {} {}", field("layers"), field("width"), field("heads"),
                                          field("context"), field("alphabet"));
    if (found != expected) {
        throw value_error(fmt::format("charlm: checkpoint '{}' is for another model or corpus (layers width heads "
                                      "context alphabet: {}; this run: {})",
                                      directory.string(), found, expected));
    }
    const std::vector<std::string> names = parameter_names(config_);
    AdamState state;
    state.steps = std::stoul(field("steps_done"));
    std::vector<Tensor<double>> loaded;
    for (std::size_t i = 0; i < names.size(); ++i) {
        loaded.push_back(load_npy<double>(directory / ("param." + names[i] + ".npy")));
        state.first.push_back(load_npy<double>(directory / ("adam_m." + names[i] + ".npy")));
        state.second.push_back(load_npy<double>(directory / ("adam_v." + names[i] + ".npy")));
        if (!(loaded[i].shape() == parameters_[i].shape())) {
            throw value_error(fmt::format("charlm: checkpoint parameter {} is {}, the model needs {}", names[i],
                                          loaded[i].shape().to_string(), parameters_[i].shape().to_string()));
        }
    }
    parameters_ = std::move(loaded);
    adam_.restore(state.steps == 0 ? AdamState{} : std::move(state));
}

// `length` characters after `prompt`, each drawn from softmax(logits / temperature) with a
// generator seeded by `seed`. The prompt goes through the model as one block, then every new
// character as a block of one, through the memory (query_offset = the characters held). When the
// context is full, the memory starts again from the last half of the context.
inline std::string CharLmTrainer::sample(const std::string& prompt, std::size_t length, std::uint64_t seed,
                                         double temperature) {
    std::mt19937_64 generator(seed);
    std::vector<std::size_t> history;
    for (const char c : clean_text(prompt)) history.push_back(corpus_.token_of(c));
    if (history.empty()) history.push_back(corpus_.token_of('\n'));
    std::string text;
    TransformerMemory<double> memory;
    std::vector<std::size_t> block(history.end() - static_cast<std::ptrdiff_t>(std::min(history.size(), config_.context - 1)), history.end());
    for (std::size_t n = 0; n < length; ++n) {
        if (memory.length + block.size() > config_.context) {
            memory = {};
            block.assign(history.end() - static_cast<std::ptrdiff_t>(config_.context / 2), history.end());
        }
        tape_.clear();
        const auto vars = TransformerVars<double>::record(tape_, parameters_, config_);
        const Tensor<double> logits =
            transformer_logits(vars, config_, std::span<const std::size_t>(block), 1, {.memory = &memory}).value();
        const std::size_t V = config_.vocabulary, last = (block.size() - 1) * V;
        double largest = logits[last], total = 0;
        for (std::size_t v = 0; v < V; ++v) largest = std::max(largest, logits[last + v]);
        std::vector<double> weights(V);
        for (std::size_t v = 0; v < V; ++v) total += weights[v] = std::exp((logits[last + v] - largest) / temperature);
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
