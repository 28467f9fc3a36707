/// \file
/// A character-level language model on real text: the transformer of models/transformer.hpp
/// trained with AdamW, warm-up + cosine decay and global-norm clipping (models/optimizer.hpp) on
/// text from Debian's `fortunes` package. The pieces examples/train_charlm.cpp and the tests use:
///   * CharLmSettings: the model size and the training schedule (typed, with their defaults);
///   * Corpus: plain-text files read in the given order, cleaned, split into training and
///     validation text, encoded over the alphabet of characters that occur;
///   * BasicCharLmTrainer<T> (T = double, CharLmTrainer, or float): parameters, optimizer, one
///     reused Tape<T> per micro-batch; a step on the batch of a given step number (drawn from a
///     generator seeded by (seed, step), so a resumed run draws the same batches), its
///     micro-batches on as many threads as the threads setting gives, the validation loss,
///     checkpoints (one .npy per parameter and per Adam moment in T, plus a manifest naming T, written
///     atomically; find_checkpoint finds the last complete one after a killed save) and sampling
///     from a prompt through the memory path.
#pragma once

#include "autodiff/parallel.hpp"
#include "io/npy.hpp"
#include "io/read_file.hpp"
#include "io/tape_file.hpp"
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
#include <vector>

namespace tapegrad {

struct CharLmSettings {
    std::size_t layers = 2;
    std::size_t width = 64;
    std::size_t heads = 4;
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
/// from the double initialisation rounded to float, so both types start from the same draw.
template <std::floating_point T>
class BasicCharLmTrainer {
public:
    BasicCharLmTrainer(const CharLmSettings& settings, const Corpus& corpus)
        : settings_(settings),
          corpus_(corpus),
          config_(settings.model(corpus.alphabet.size())),
          parameters_(initial(config_)),
          adam_(settings.adam()) {
        if (settings.micro_batches == 0 || settings.micro_batches > settings.batch) {
            throw value_error(fmt::format("charlm: micro_batches is {}; it must be 1 to the batch size ({})",
                                          settings.micro_batches, settings.batch));
        }
        for (std::size_t part = 0; part < settings.micro_batches; ++part) tapes_.emplace_back();
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
            const auto vars = record_parameters(tapes_.front());
            total += static_cast<double>(starts.size()) *
                     static_cast<double>(transformer_loss(vars, config_, std::span<const std::size_t>(batch.tokens),
                                                          std::span<const std::size_t>(batch.targets), batch.size)
                                             .value()
                                             .item());
        }
        return total / static_cast<double>(count);
    }

    std::size_t steps_done() const { return adam_.steps(); }
    double last_gradient_norm() const { return last_norm_; }
    const std::vector<Tensor<T>>& parameters() const { return parameters_; }
    const TransformerConfig& config() const { return config_; }
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
    static std::vector<Tensor<T>> initial(const TransformerConfig& c) {
        if constexpr (std::is_same_v<T, double>) {
            return initial_parameters(c);
        } else {
            std::vector<Tensor<T>> rounded;
            for (const Tensor<double>& p : initial_parameters(c)) rounded.push_back(tensor_cast<T>(p));
            return rounded;
        }
    }
    /// The parameters as named leaves of `tape`, cleared (copied as they are: no conversion).
    TransformerVars<T> record_parameters(Tape<T>& tape) const {
        tape.clear();
        const std::vector<std::string> names = parameter_names(config_);
        std::vector<Var<T>> leaves;
        for (std::size_t i = 0; i < parameters_.size(); ++i) leaves.push_back(tape.leaf(parameters_[i], names[i]));
        return TransformerVars<T>::from(leaves, config_);
    }
    double forward_backward(const CharBatch& batch);

    CharLmSettings settings_;
    const Corpus& corpus_;
    TransformerConfig config_;
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
        const TransformerVars<T> vars = record_parameters(tapes_[part]);
        const auto window = [&](const std::vector<std::size_t>& v) {
            return std::span<const std::size_t>(v).subspan(first * context, count * context);
        };
        losses_[part] = transformer_loss(vars, config_, window(batch.tokens), window(batch.targets), count);
        tapes_[part].backward(losses_[part]);
        leaves[part] = vars.all();
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

/// The manifest: format line, step count, the alphabet, the model size, the scalar type, then one
/// line per parameter. A checkpoint written before float training has no dtype line: float64.
inline std::string manifest(const TransformerConfig& c, const std::string& alphabet, std::size_t steps,
                            std::string_view dtype) {
    std::string text = fmt::format("tapegrad-charlm-checkpoint 1\nsteps_done {}\nalphabet {}\nlayers {}\nwidth {}\n"
                                   "heads {}\ncontext {}\ndtype {}\n",
                                   steps, hex(alphabet), c.layers, c.width, c.heads, c.context, dtype);
    const std::vector<std::string> names = parameter_names(c);
    const std::vector<Shape> shapes = parameter_shapes(c);
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
/// place and removes the partial one. A float32 run writes float32 files.
template <std::floating_point T>
void BasicCharLmTrainer<T>::save(const std::filesystem::path& directory) const {
    namespace fs = std::filesystem;
    const fs::path partial = directory.string() + ".partial", previous = directory.string() + ".previous";
    constexpr NpyDtype dtype = std::is_same_v<T, float> ? NpyDtype::float32 : NpyDtype::float64;
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
        const std::vector<std::string> names = parameter_names(config_);
        const auto& state = adam_.state();
        for (std::size_t i = 0; i < names.size(); ++i) {
            const Tensor<T> zero(parameters_[i].shape());
            write_file_atomically((partial / ("param." + names[i] + ".npy")).string(), npy_bytes(parameters_[i], dtype),
                                  "charlm");
            write_file_atomically((partial / ("adam_m." + names[i] + ".npy")).string(),
                                  npy_bytes(state.first.empty() ? zero : state.first[i], dtype), "charlm");
            write_file_atomically((partial / ("adam_v." + names[i] + ".npy")).string(),
                                  npy_bytes(state.second.empty() ? zero : state.second[i], dtype), "charlm");
            if (i + 1 == names.size() / 2) charlm_files::test_pause("files", adam_.steps());
        }
        write_file_atomically((partial / "manifest.txt").string(),
                              charlm_files::manifest(config_, corpus_.alphabet, adam_.steps(), dtype_name<T>()), "charlm");
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

/// Reads the checkpoint find_checkpoint(directory) finds; refuses one of another model size,
/// alphabet or scalar type (no silent conversion: a float64 run resumed in float32 would not be
/// the run it claims to continue; convert the .npy files explicitly if that is what is wanted).
template <std::floating_point T>
std::filesystem::path BasicCharLmTrainer<T>::load(const std::filesystem::path& requested) {
    const std::filesystem::path directory = find_checkpoint(requested);
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
    const std::string dtype = fields.contains("dtype") ? fields.at("dtype") : "float64";
    if (dtype != dtype_name<T>()) {
        throw value_error(fmt::format("charlm: checkpoint '{}' holds {} parameters and moments, this run trains in {}: "
                                      "resume it with --dtype {}",
                                      directory.string(), dtype, dtype_name<T>(), dtype));
    }
    const NpyDtype expected_dtype = std::is_same_v<T, float> ? NpyDtype::float32 : NpyDtype::float64;
    const auto read = [&](const std::filesystem::path& file) {
        const std::string bytes = read_file_bytes(file, "charlm");
        const std::string source = fmt::format("'{}'", file.string());
        if (parse_npy_header(bytes, source).dtype != expected_dtype) {
            throw value_error(fmt::format("charlm: '{}' is not {} as its manifest says", file.string(), dtype));
        }
        return parse_npy<T>(bytes, source);
    };
    const std::vector<std::string> names = parameter_names(config_);
    BasicAdamState<T> state;
    state.steps = std::stoul(field("steps_done"));
    std::vector<Tensor<T>> loaded;
    for (std::size_t i = 0; i < names.size(); ++i) {
        loaded.push_back(read(directory / ("param." + names[i] + ".npy")));
        state.first.push_back(read(directory / ("adam_m." + names[i] + ".npy")));
        state.second.push_back(read(directory / ("adam_v." + names[i] + ".npy")));
        if (!(loaded[i].shape() == parameters_[i].shape())) {
            throw value_error(fmt::format("charlm: checkpoint parameter {} is {}, the model needs {}", names[i],
                                          loaded[i].shape().to_string(), parameters_[i].shape().to_string()));
        }
    }
    parameters_ = std::move(loaded);
    adam_.restore(state.steps == 0 ? BasicAdamState<T>{} : std::move(state));
    return directory;
}

/// `length` characters after `prompt`, each drawn from softmax(logits / temperature) with a
/// generator seeded by `seed`. The prompt goes through the model as one block, then every new
/// character as a block of one, through the memory (query_offset = the characters held). When the
/// context is full, the memory starts again from the last half of the context. The logits are T;
/// the drawing is done in double.
template <std::floating_point T>
std::string BasicCharLmTrainer<T>::sample(const std::string& prompt, std::size_t length, std::uint64_t seed,
                                          double temperature) {
    std::mt19937_64 generator(seed);
    std::vector<std::size_t> history;
    for (const char c : clean_text(prompt)) history.push_back(corpus_.token_of(c));
    if (history.empty()) history.push_back(corpus_.token_of('\n'));
    std::string text;
    TransformerMemory<T> memory;
    std::vector<std::size_t> block(history.end() - static_cast<std::ptrdiff_t>(std::min(history.size(), config_.context - 1)), history.end());
    for (std::size_t n = 0; n < length; ++n) {
        if (memory.length + block.size() > config_.context) {
            memory = {};
            block.assign(history.end() - static_cast<std::ptrdiff_t>(config_.context / 2), history.end());
        }
        const auto vars = record_parameters(tapes_.front());
        const Tensor<T> logits =
            transformer_logits(vars, config_, std::span<const std::size_t>(block), 1, {.memory = &memory}).value();
        const std::size_t V = config_.vocabulary, last = (block.size() - 1) * V;
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
